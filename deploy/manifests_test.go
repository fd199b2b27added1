package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The parts of the Kubernetes objects the manifests use. Decoding is strict
// (unknown fields fail, as `kubectl apply` validates by default), so a field
// the manifests start to use must be added here, spelled as the API does.

type meta struct {
	Name        string            `yaml:"name"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   meta   `yaml:"metadata"`
}

type configMap struct {
	object `yaml:",inline"`
	Data   map[string]string `yaml:"data"`
}

type servicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort string `yaml:"targetPort"`
}

type service struct {
	object `yaml:",inline"`
	Spec   struct {
		ClusterIP                string            `yaml:"clusterIP"`
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
		Selector                 map[string]string `yaml:"selector"`
		Ports                    []servicePort     `yaml:"ports"`
	} `yaml:"spec"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
		SecretKeyRef *secretKeyRef `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

type secretKeyRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	PeriodSeconds       int `yaml:"periodSeconds"`
	InitialDelaySeconds int `yaml:"initialDelaySeconds"`
}

type container struct {
	Name         string          `yaml:"name"`
	Image        string          `yaml:"image"`
	Command      []string        `yaml:"command"`
	Args         []string        `yaml:"args"`
	Env          []envVar        `yaml:"env"`
	Ports        []containerPort `yaml:"ports"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
}

type podTemplate struct {
	Metadata meta `yaml:"metadata"`
	Spec     struct {
		RestartPolicy string      `yaml:"restartPolicy"`
		Containers    []container `yaml:"containers"`
		Volumes       []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type statefulSet struct {
	object `yaml:",inline"`
	Spec   struct {
		ServiceName         string        `yaml:"serviceName"`
		Replicas            int           `yaml:"replicas"`
		PodManagementPolicy string        `yaml:"podManagementPolicy"`
		Selector            labelSelector `yaml:"selector"`
		Template            podTemplate   `yaml:"template"`
	} `yaml:"spec"`
}

type deployment struct {
	object `yaml:",inline"`
	Spec   struct {
		Replicas int           `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template podTemplate   `yaml:"template"`
	} `yaml:"spec"`
}

type job struct {
	object `yaml:",inline"`
	Spec   struct {
		CompletionMode          string      `yaml:"completionMode"`
		Completions             int         `yaml:"completions"`
		Parallelism             int         `yaml:"parallelism"`
		BackoffLimit            *int        `yaml:"backoffLimit"`
		TTLSecondsAfterFinished *int        `yaml:"ttlSecondsAfterFinished"`
		Template                podTemplate `yaml:"template"`
	} `yaml:"spec"`
}

type kustomization struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Resources  []string `yaml:"resources"`
}

// apiVersions is the API group and version of each kind the manifests use.
var apiVersions = map[string]string{
	"ConfigMap":     "v1",
	"Service":       "v1",
	"StatefulSet":   "apps/v1",
	"Deployment":    "apps/v1",
	"Job":           "batch/v1",
	"Kustomization": "kustomize.config.k8s.io/v1beta1",
}

// manifests are the objects of deploy/kubernetes by kind and name.
type manifests struct {
	files        []string // the YAML files, base names
	configMaps   map[string]configMap
	services     map[string]service
	statefulSets map[string]statefulSet
	deployments  map[string]deployment
	jobs         map[string]job
	kustomize    *kustomization
}

const k8sDir = "kubernetes"

// loadManifests parses every document of every YAML file in deploy/kubernetes
// into its kind's type.
func loadManifests(t *testing.T) *manifests {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s (%v)", k8sDir, err)
	}
	m := &manifests{configMaps: map[string]configMap{}, services: map[string]service{},
		statefulSets: map[string]statefulSet{}, deployments: map[string]deployment{}, jobs: map[string]job{}}
	for _, p := range paths {
		m.files = append(m.files, filepath.Base(p))
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for i := 0; ; i++ {
			var doc yaml.Node
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: document %d: %v", p, i, err)
			}
			if err := m.add(&doc); err != nil {
				t.Fatalf("%s: document %d: %v", p, i, err)
			}
		}
	}
	return m
}

// add decodes one document strictly into the type of its kind.
func (m *manifests) add(doc *yaml.Node) error {
	var h object
	if err := doc.Decode(&h); err != nil {
		return err
	}
	want, ok := apiVersions[h.Kind]
	if !ok {
		return fmt.Errorf("kind %q: not one the tests know", h.Kind)
	}
	if h.APIVersion != want {
		return fmt.Errorf("%s %s: apiVersion %q, want %q", h.Kind, h.Metadata.Name, h.APIVersion, want)
	}
	if h.Kind != "Kustomization" && h.Metadata.Name == "" {
		return fmt.Errorf("%s without a name", h.Kind)
	}
	raw, err := yaml.Marshal(doc)
	if err != nil {
		return err
	}
	strict := func(v any) error {
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		if err := dec.Decode(v); err != nil {
			return fmt.Errorf("%s %s: %w", h.Kind, h.Metadata.Name, err)
		}
		return nil
	}
	dup := fmt.Errorf("%s %s defined twice", h.Kind, h.Metadata.Name)
	switch h.Kind {
	case "ConfigMap":
		return addTo(m.configMaps, h.Metadata.Name, strict, dup)
	case "Service":
		return addTo(m.services, h.Metadata.Name, strict, dup)
	case "StatefulSet":
		return addTo(m.statefulSets, h.Metadata.Name, strict, dup)
	case "Deployment":
		return addTo(m.deployments, h.Metadata.Name, strict, dup)
	case "Job":
		return addTo(m.jobs, h.Metadata.Name, strict, dup)
	default: // Kustomization
		if m.kustomize != nil {
			return errors.New("two Kustomizations")
		}
		m.kustomize = new(kustomization)
		return strict(m.kustomize)
	}
}

func addTo[T any](objs map[string]T, name string, decode func(any) error, dup error) error {
	if _, ok := objs[name]; ok {
		return dup
	}
	var v T
	if err := decode(&v); err != nil {
		return err
	}
	objs[name] = v
	return nil
}

// only returns the one object of a map, failing unless there is exactly one.
func only[T any](t *testing.T, kind string, objs map[string]T) (string, T) {
	t.Helper()
	if len(objs) != 1 {
		t.Fatalf("%d %ss, want 1", len(objs), kind)
	}
	for name, o := range objs {
		return name, o
	}
	panic("unreachable")
}

// workload is a pod template with where it comes from.
type workload struct {
	kind, name string
	tmpl       podTemplate
}

func (m *manifests) workloads() []workload {
	var ws []workload
	for n, s := range m.statefulSets {
		ws = append(ws, workload{"StatefulSet", n, s.Spec.Template})
	}
	for n, d := range m.deployments {
		ws = append(ws, workload{"Deployment", n, d.Spec.Template})
	}
	for n, j := range m.jobs {
		ws = append(ws, workload{"Job", n, j.Spec.Template})
	}
	return ws
}

// selects reports whether a selector matches labels (every key equal).
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// port returns the number of the container port called name (0 if none).
func (c container) port(name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// pod is what Kubernetes fills in for one pod of a template: the downward
// API's fields and the Secrets' values.
type pod struct {
	name, ip            string
	labels, annotations map[string]string
}

var (
	envRef   = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	fieldKey = regexp.MustCompile(`^metadata\.(labels|annotations)\['([^']+)'\]$`)
)

// env resolves c's environment in p as the kubelet does: valueFrom from the
// pod, and $(NAME) in a value replaced by an earlier variable's value
// (references to unknown names stay as they are).
func (p pod) env(c container) (map[string]string, error) {
	env := map[string]string{}
	for _, e := range c.Env {
		if _, ok := env[e.Name]; ok {
			return nil, fmt.Errorf("%s set twice", e.Name)
		}
		v := envRef.ReplaceAllStringFunc(e.Value, func(ref string) string {
			if val, ok := env[ref[2:len(ref)-1]]; ok {
				return val
			}
			return ref
		})
		if f := e.ValueFrom; f != nil {
			var err error
			switch {
			case e.Value != "":
				return nil, fmt.Errorf("%s has both value and valueFrom", e.Name)
			case f.FieldRef != nil:
				v, err = p.field(f.FieldRef.FieldPath)
			case f.SecretKeyRef != nil:
				v = testSecret(f.SecretKeyRef.Name, f.SecretKeyRef.Key)
			default:
				err = errors.New("valueFrom of an unknown source")
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name, err)
			}
		}
		env[e.Name] = v
	}
	return env, nil
}

func (p pod) field(path string) (string, error) {
	switch path {
	case "metadata.name":
		return p.name, nil
	case "status.podIP":
		return p.ip, nil
	}
	m := fieldKey.FindStringSubmatch(path)
	if m == nil {
		return "", fmt.Errorf("fieldPath %q: not one the tests resolve", path)
	}
	vals := p.labels
	if m[1] == "annotations" {
		vals = p.annotations
	}
	v, ok := vals[m[2]]
	if !ok {
		return "", fmt.Errorf("fieldPath %q: the pod has no such %s", path, strings.TrimSuffix(m[1], "s"))
	}
	return v, nil
}

// flagValue returns the argument after flag in args ("" if absent).
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}
