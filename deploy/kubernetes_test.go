package deploy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// TestKubernetesObjects checks that the objects fit together: every YAML
// file is in the kustomization, workloads select their own pods, every
// Service reaches a port its pods declare under the same number, and every
// scrape annotation names a declared port.
func TestKubernetesObjects(t *testing.T) {
	m := loadManifests(t)
	if m.kustomize == nil {
		t.Fatal("no kustomization.yaml")
	}
	var want []string
	for _, f := range m.files {
		if f != "kustomization.yaml" {
			want = append(want, f)
		}
	}
	if got := slices.Sorted(slices.Values(m.kustomize.Resources)); !slices.Equal(got, want) {
		t.Errorf("kustomization resources %v, want the manifests %v", got, want)
	}
	for n, s := range m.statefulSets {
		if !selects(s.Spec.Selector.MatchLabels, s.Spec.Template.Metadata.Labels) {
			t.Errorf("StatefulSet %s: selector %v does not match its pods' labels", n, s.Spec.Selector.MatchLabels)
		}
	}
	for n, d := range m.deployments {
		if !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Metadata.Labels) {
			t.Errorf("Deployment %s: selector %v does not match its pods' labels", n, d.Spec.Selector.MatchLabels)
		}
	}
	for n, s := range m.services {
		var pods []workload
		for _, w := range m.workloads() {
			if selects(s.Spec.Selector, w.tmpl.Metadata.Labels) {
				pods = append(pods, w)
			}
		}
		if len(pods) == 0 {
			t.Errorf("Service %s: selector %v matches no workload's pods", n, s.Spec.Selector)
		}
		for _, w := range pods {
			for _, sp := range s.Spec.Ports {
				found := false
				for _, c := range w.tmpl.Spec.Containers {
					if p := c.port(sp.TargetPort); p != 0 {
						found = true
						if p != sp.Port {
							t.Errorf("Service %s port %s is %d, %s %s's container port %d", n, sp.Name, sp.Port, w.kind, w.name, p)
						}
					}
				}
				if !found {
					t.Errorf("Service %s: %s %s declares no container port %q", n, w.kind, w.name, sp.TargetPort)
				}
			}
		}
	}
	for _, w := range m.workloads() {
		ann := w.tmpl.Metadata.Annotations
		if ann["prometheus.io/scrape"] != "true" {
			continue
		}
		declared := false
		for _, c := range w.tmpl.Spec.Containers {
			for _, p := range c.Ports {
				declared = declared || strconv.Itoa(p.ContainerPort) == ann["prometheus.io/port"]
			}
		}
		if !declared {
			t.Errorf("%s %s: prometheus.io/port %q is no container port", w.kind, w.name, ann["prometheus.io/port"])
		}
	}
}

// natsCluster is the NATS part of the manifests.
type natsCluster struct {
	name     string // the StatefulSet's
	sts      statefulSet
	c        container // the server's
	confKey  string    // in the ConfigMap
	conf     string
	confPath string // where the container reads it
}

// loadNATS finds the StatefulSet running nats-server and its configuration
// file, following its --config argument to the ConfigMap mounted there.
func loadNATS(t *testing.T, m *manifests) natsCluster {
	t.Helper()
	name, sts := only(t, "StatefulSet", m.statefulSets)
	if len(sts.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("StatefulSet %s: %d containers, want 1", name, len(sts.Spec.Template.Spec.Containers))
	}
	n := natsCluster{name: name, sts: sts, c: sts.Spec.Template.Spec.Containers[0]}
	n.confPath = flagValue(n.c.Args, "--config")
	if n.confPath == "" {
		t.Fatalf("StatefulSet %s: args %q have no --config FILE", name, n.c.Args)
	}
	for _, vm := range n.c.VolumeMounts {
		if path.Dir(n.confPath) != path.Clean(vm.MountPath) {
			continue
		}
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				n.confKey = path.Base(n.confPath)
				var ok bool
				if n.conf, ok = m.configMaps[v.ConfigMap.Name].Data[n.confKey]; !ok {
					t.Fatalf("ConfigMap %s has no %s (mounted at %s)", v.ConfigMap.Name, n.confKey, vm.MountPath)
				}
			}
		}
	}
	if n.conf == "" {
		t.Fatalf("StatefulSet %s: no ConfigMap is mounted where --config %s points", name, n.confPath)
	}
	return n
}

// writeConf writes the NATS configuration to a file and sets the environment
// the configuration refers to as the server's pod ordinal i sees it.
func (n natsCluster) writeConf(t *testing.T, i int) string {
	t.Helper()
	env, err := pod{name: fmt.Sprintf("%s-%d", n.name, i), ip: "10.0.1.1"}.env(n.c)
	if err != nil {
		t.Fatalf("StatefulSet %s: %v", n.name, err)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	p := filepath.Join(t.TempDir(), n.confKey)
	if err := os.WriteFile(p, []byte(n.conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNATSCluster checks the NATS cluster against its configuration, as the
// nats-server library a2ad embeds reads it: the container and Service ports
// are the configured ones, the routes name every StatefulSet pod through the
// headless Service, the limits are those of a2ad's embedded server, and the
// image runs the server version a2ad embeds.
func TestNATSCluster(t *testing.T) {
	m := loadManifests(t)
	n := loadNATS(t, m)
	opts, err := server.ProcessConfigFile(n.writeConf(t, 0))
	if err != nil {
		t.Fatalf("%s: %v", n.confKey, err)
	}
	for _, p := range []struct {
		name string
		conf int
	}{{"client", opts.Port}, {"cluster", opts.Cluster.Port}, {"monitor", opts.HTTPPort}} {
		if got := n.c.port(p.name); got != p.conf || p.conf <= 0 {
			t.Errorf("container port %s = %d, the configuration's is %d", p.name, got, p.conf)
		}
	}

	headless, ok := m.services[n.sts.Spec.ServiceName]
	if !ok || headless.Spec.ClusterIP != "None" {
		t.Fatalf("StatefulSet %s: serviceName %q is no headless Service", n.name, n.sts.Spec.ServiceName)
	}
	if !selects(headless.Spec.Selector, n.sts.Spec.Template.Metadata.Labels) {
		t.Errorf("headless Service %s does not select the NATS pods", n.sts.Spec.ServiceName)
	}
	if !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("headless Service %s: the routes must resolve before the servers are ready (publishNotReadyAddresses)", n.sts.Spec.ServiceName)
	}
	if n.sts.Spec.Replicas < 3 {
		t.Errorf("StatefulSet %s: %d replicas, want a cluster of 3", n.name, n.sts.Spec.Replicas)
	}
	var routes, want []string
	for _, u := range opts.Routes {
		routes = append(routes, u.Host)
	}
	for i := range n.sts.Spec.Replicas {
		want = append(want, net.JoinHostPort(fmt.Sprintf("%s-%d.%s", n.name, i, n.sts.Spec.ServiceName), strconv.Itoa(opts.Cluster.Port)))
	}
	if slices.Sort(routes); !slices.Equal(routes, want) {
		t.Errorf("cluster routes %v, want every pod through the headless Service: %v", routes, want)
	}
	if opts.Cluster.Name == "" {
		t.Error("the cluster has no name")
	}
	if opts.ServerName != n.name+"-0" {
		t.Errorf("server_name = %q in pod %s-0", opts.ServerName, n.name)
	}

	embedded, err := natsd.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer embedded.Shutdown()
	v, err := embedded.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if int64(opts.MaxPayload) != int64(v.MaxPayload) || opts.MaxPending != v.MaxPending || opts.WriteDeadline != v.WriteDeadline {
		t.Errorf("max_payload %d, max_pending %d, write_deadline %v; a2ad's embedded server has %d, %d, %v",
			opts.MaxPayload, opts.MaxPending, opts.WriteDeadline, v.MaxPayload, v.MaxPending, v.WriteDeadline)
	}

	tag := regexp.MustCompile(`^nats:(\d+\.\d+)[.-]`).FindStringSubmatch(n.c.Image)
	if tag == nil || !strings.HasPrefix(server.VERSION, tag[1]+".") {
		t.Errorf("image %s: want the official nats image of the server a2ad embeds, %s", n.c.Image, server.VERSION)
	}
}

// TestNATSConfigFile runs the configuration through `nats-server -t`, the
// server's own configuration test (Debian's nats-server, from make deps).
func TestNATSConfigFile(t *testing.T) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Fatal("nats-server binary not found: run `make deps` (installs Debian's nats-server)")
	}
	n := loadNATS(t, loadManifests(t))
	out, err := exec.Command(bin, "-t", "-c", n.writeConf(t, 1)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "is valid") {
		t.Fatalf("nats-server -t: %v\n%s", err, out)
	}
}

// rankJob is the Job of the ranks and the one container that runs a rank.
type rankJob struct {
	name string
	job  job
	c    container
}

func loadJob(t *testing.T, m *manifests) rankJob {
	t.Helper()
	name, j := only(t, "Job", m.jobs)
	if len(j.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Job %s: %d containers, want 1", name, len(j.Spec.Template.Spec.Containers))
	}
	return rankJob{name, j, j.Spec.Template.Spec.Containers[0]}
}

// testSecret stands in for key of the Secret name that the manifests refer
// to: a value of its own for every key, as `kubectl create secret` makes them.
func testSecret(name, key string) string {
	return fmt.Sprintf("%x", sha256.Sum256([]byte(name+"/"+key)))[:32]
}

// pod returns what Kubernetes fills in for the Job's pod of completion index
// i: the Job controller's labels and annotation, an address.
func (rj rankJob) pod(i int, ip string) pod {
	labels := map[string]string{"batch.kubernetes.io/job-name": rj.name, "job-name": rj.name,
		"batch.kubernetes.io/controller-uid": "c0ffee00-0000-4000-8000-000000000000"}
	for k, v := range rj.job.Spec.Template.Metadata.Labels {
		labels[k] = v
	}
	ann := map[string]string{"batch.kubernetes.io/job-completion-index": strconv.Itoa(i)}
	for k, v := range rj.job.Spec.Template.Metadata.Annotations {
		ann[k] = v
	}
	return pod{name: fmt.Sprintf("%s-%d-x7k2p", rj.name, i), ip: ip, labels: labels, annotations: ann}
}

// clearA2AEnv unsets every A2A_* variable for the test, so that only the
// ones the test sets reach a2a.ConfigFromEnv.
func clearA2AEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "A2A_") {
			t.Setenv(k, "") // restored when the test ends
			os.Unsetenv(k)
		}
	}
}

// rankConfig reads a rank's environment with a2a.ConfigFromEnv, and checks
// that every A2A_* variable in it is one ConfigFromEnv reads: the Config must
// change without it.
func rankConfig(t *testing.T, env map[string]string) a2a.Config {
	t.Helper()
	clearA2AEnv(t)
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := a2a.ConfigFromEnv()
	if err != nil {
		t.Fatalf("a2a.ConfigFromEnv: %v", err)
	}
	for name, v := range env {
		if !strings.HasPrefix(name, "A2A_") {
			continue
		}
		os.Unsetenv(name)
		without, err := a2a.ConfigFromEnv()
		os.Setenv(name, v)
		if err == nil && reflect.DeepEqual(without, cfg) {
			t.Errorf("%s=%q: a2a.ConfigFromEnv does not read it (the Config is the same without it)", name, v)
		}
	}
	return cfg
}

// TestJobRanks checks the Job of the ranks: Indexed, all ranks at once, and
// the environment of each pod makes a2a.ConfigFromEnv return the Config of its
// rank: the completion index as A2A_RANK, the world size, the NATS Service,
// the Secret, the pod's address for the data plane.
func TestJobRanks(t *testing.T) {
	m := loadManifests(t)
	rj := loadJob(t, m)
	spec := rj.job.Spec
	if spec.CompletionMode != "Indexed" {
		t.Errorf("completionMode %q, want Indexed (the completion index is the rank)", spec.CompletionMode)
	}
	if spec.Completions < 1 || spec.Parallelism != spec.Completions {
		t.Errorf("completions %d, parallelism %d: every rank must run at once", spec.Completions, spec.Parallelism)
	}
	if spec.BackoffLimit == nil || *spec.BackoffLimit != 0 || spec.Template.Spec.RestartPolicy != "Never" {
		t.Error("a restarted rank cannot rejoin its aborted group: want backoffLimit 0 and restartPolicy Never")
	}
	var rankFrom string
	secretFrom := map[string]*secretKeyRef{}
	for _, e := range rj.c.Env {
		switch {
		case e.Name == "A2A_RANK" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			rankFrom = e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			secretFrom[e.Name] = e.ValueFrom.SecretKeyRef
		}
	}
	if rankFrom != "metadata.annotations['batch.kubernetes.io/job-completion-index']" {
		t.Errorf("A2A_RANK from %q, want the completion index annotation", rankFrom)
	}
	for _, v := range []string{"A2A_SECRET", "A2A_NATS_PASSWORD"} {
		if secretFrom[v] == nil {
			t.Errorf("%s must come from a Secret (secretKeyRef)", v)
		}
	}

	n := loadNATS(t, m)
	const podIP = "10.0.2.7"
	for i := range spec.Completions {
		env, err := rj.pod(i, podIP).env(rj.c)
		if err != nil {
			t.Fatalf("Job %s: %v", rj.name, err)
		}
		for name := range env {
			// Every other variable serves one that a2a reads, or the command.
			used := strings.HasPrefix(name, "A2A_") || slices.ContainsFunc(rj.c.Env, func(e envVar) bool {
				return strings.Contains(e.Value, "$("+name+")")
			}) || strings.Contains(strings.Join(append(rj.c.Command, rj.c.Args...), " "), "$"+name)
			if !used {
				t.Errorf("%s: no A2A_* variable nor the command uses it", name)
			}
		}
		cfg := rankConfig(t, env)
		if cfg.Rank != i || cfg.WorldSize != spec.Completions {
			t.Errorf("pod %d: rank %d of %d, want %d of completions %d", i, cfg.Rank, cfg.WorldSize, i, spec.Completions)
		}
		if ref := secretFrom["A2A_SECRET"]; ref == nil || cfg.Secret != testSecret(ref.Name, ref.Key) || cfg.Group != rj.name || cfg.Listen != podIP+":0" {
			t.Errorf("pod %d: secret %q, group %q, listen %q; want the Secret's, the Job's name, %s:0", i, cfg.Secret, cfg.Group, cfg.Listen, podIP)
		}
		u, err := url.Parse(cfg.NATSURL)
		if err != nil {
			t.Fatalf("A2A_NATS_URL: %v", err)
		}
		svc, ok := m.services[u.Hostname()]
		if !ok || !selects(svc.Spec.Selector, n.sts.Spec.Template.Metadata.Labels) ||
			!slices.ContainsFunc(svc.Spec.Ports, func(p servicePort) bool { return strconv.Itoa(p.Port) == u.Port() && p.TargetPort == "client" }) {
			t.Errorf("A2A_NATS_URL %s: not a Service port reaching the NATS servers' client port", cfg.NATSURL)
		}
	}
}

// TestControlService checks the a2ad Deployment: it serves the NATS cluster
// the ranks use, and its /metrics port is the one it declares.
func TestControlService(t *testing.T) {
	m := loadManifests(t)
	name, d := only(t, "Deployment", m.deployments)
	if d.Spec.Replicas != 1 {
		t.Errorf("Deployment %s: %d replicas, want one control service", name, d.Spec.Replicas)
	}
	c := d.Spec.Template.Spec.Containers[0]
	args := append(c.Command[1:], c.Args...)
	if path.Base(c.Command[0]) != "a2ad" || args[0] != "serve" {
		t.Fatalf("Deployment %s runs %q, want a2ad serve", name, append(c.Command, c.Args...))
	}
	rj := loadJob(t, m)
	env, err := rj.pod(0, "10.0.2.7").env(rj.c)
	if err != nil {
		t.Fatal(err)
	}
	if got := flagValue(args, "--nats"); got != env["A2A_NATS_URL"] {
		t.Errorf("a2ad serve --nats %q, the ranks' A2A_NATS_URL %q", got, env["A2A_NATS_URL"])
	}
	_, port, err := net.SplitHostPort(flagValue(args, "--metrics"))
	if err != nil || port != strconv.Itoa(c.port("metrics")) {
		t.Errorf("a2ad serve --metrics %q, container port metrics %d", flagValue(args, "--metrics"), c.port("metrics"))
	}
	if c.Image != rj.c.Image {
		t.Errorf("a2ad runs %s, the ranks %s: want the image of deploy/Dockerfile for both", c.Image, rj.c.Image)
	}
}

// TestDockerfile checks that the image builds with the Go of go.mod and
// holds the programs the manifests run.
func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	from := regexp.MustCompile(`(?m)^FROM golang:(\S+)`).FindSubmatch(raw)
	if goVersion == nil || from == nil || string(from[1]) != string(goVersion[1]) {
		t.Errorf("Dockerfile builds with golang:%s, go.mod wants go %s", from, goVersion)
	}
	build := regexp.MustCompile(`(?m)^RUN .*go build .*$`).Find(raw)
	binaries := map[string]bool{}
	for _, f := range strings.Fields(string(build)) {
		if strings.HasPrefix(f, "./") {
			binaries[path.Base(f)] = true
		}
	}
	m := loadManifests(t)
	for _, w := range m.workloads() {
		for _, c := range w.tmpl.Spec.Containers {
			if strings.HasPrefix(c.Image, "nats:") {
				continue
			}
			prog := path.Base(c.Command[0])
			if prog == "sh" { // sh -c "exec PROG ..."
				f := strings.Fields(strings.Join(c.Args, " "))
				if len(f) < 2 || f[0] != "exec" {
					t.Errorf("%s %s: the shell command %q does not exec a program", w.kind, w.name, c.Args)
					continue
				}
				prog = f[1]
			}
			if !binaries[prog] {
				t.Errorf("%s %s runs %s, which deploy/Dockerfile does not build (%s)", w.kind, w.name, prog, build)
			}
		}
	}
}

// TestKubernetesRun runs on this machine the processes the objects describe:
// a NATS server on the ConfigMap's configuration (the nats-server library of
// the image's version; loopback addresses and free ports instead of the
// configured ones, no routes to pods that do not exist here), a2ad with the
// Deployment's command, and one process per completion index with the Job's
// command and that pod's environment. Every rank gets a loopback address of
// its own as its pod IP and A2A_HOST, as pods are hosts of their own, and the
// local server's URL. Every Secret key has a test value of its own. A client
// without the password is refused; the ranks must finish a verified MoE run
// through a2ad's control service.
func TestKubernetesRun(t *testing.T) {
	m := loadManifests(t)
	n, rj := loadNATS(t, m), loadJob(t, m)
	_, d := only(t, "Deployment", m.deployments)
	bin := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	opts, err := server.ProcessConfigFile(n.writeConf(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", server.RANDOM_PORT, 0
	opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", server.RANDOM_PORT
	opts.Routes, opts.RoutesStr = nil, ""
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	natsURL := ns.ClientURL()
	// The configuration lets in a2a's user only.
	if nc, err := nats.Connect(natsURL); err == nil || !strings.Contains(err.Error(), "Authorization Violation") {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("a client without the password: %v, want an authorization violation", err)
	}

	ac := d.Spec.Template.Spec.Containers[0]
	args := slices.Concat(ac.Command[1:], ac.Args)
	args[slices.Index(args, "--nats")+1] = natsURL
	args[slices.Index(args, "--metrics")+1] = "127.0.0.1:0"
	aenv, err := pod{name: "a2ad-5d8f9c-x2x4z", ip: "127.0.0.9"}.env(ac)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, path.Base(ac.Command[0])), args...)
	cmd.Env = append(baseEnv(t), envList(aenv)...)
	a2ad := start(t, "a2ad", cmd)
	a2ad.waitOutput(t, ctx, "control plane ready")

	size := rj.job.Spec.Completions
	ranks := make([]*proc, size)
	for i := range size {
		p := rj.pod(i, fmt.Sprintf("127.0.0.%d", 10+i))
		env, err := p.env(rj.c)
		if err != nil {
			t.Fatal(err)
		}
		env["A2A_NATS_URL"], env["A2A_HOST"] = natsURL, p.name
		cmd := exec.Command(rj.c.Command[0], slices.Concat(rj.c.Command[1:], rj.c.Args)...)
		cmd.Env = append(baseEnv(t), envList(env)...)
		ranks[i] = start(t, fmt.Sprintf("rank %d", i), cmd)
	}
	for i, r := range ranks {
		if err := r.wait(t, ctx); err != nil {
			t.Errorf("rank %d: %v\nstdout:\n%s\nstderr:\n%s", i, err, r.stdout.String(), r.stderr.String())
		}
	}
	if want := fmt.Sprintf(" steps verified on %d ranks", size); !strings.Contains(ranks[0].stdout.String(), want) {
		t.Errorf("rank 0 did not report%s:\n%s", want, ranks[0].stdout.String())
	}
	if !strings.Contains(a2ad.stderr.String(), "group formed") {
		t.Errorf("a2ad logged no group forming (A2A_LOG=info): the ranks did not use its control service\n%s", a2ad.stderr.String())
	}
}

// envList is env as NAME=VALUE strings.
func envList(env map[string]string) []string {
	var l []string
	for k, v := range env {
		l = append(l, k+"="+v)
	}
	return l
}
