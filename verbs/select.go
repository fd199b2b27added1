package verbs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// AutoGIDIndex as Config.GIDIndex picks each RoCE port's GID by itself: the RoCE v2
// IPv4-mapped one (::ffff:a.b.c.d).
const AutoGIDIndex = -1

// Config selects the ports and GIDs to use (see Endpoints). Config{GIDIndex: AutoGIDIndex}
// selects every active port with its RoCE v2 IPv4-mapped GID; the zero value differs in
// that it forces GID index 0.
type Config struct {
	// HCA filters devices and ports in NCCL_IB_HCA's syntax: a comma-separated list of
	// name[:port]; names match by prefix unless the list starts with "="; a list starting
	// with "^" (or "^=") excludes what it names. Empty: all.
	HCA string
	// GIDIndex forces this GID index on every RoCE port; AutoGIDIndex picks the RoCE v2
	// IPv4-mapped GID (or an IPv4-mapped GID of unknown type, where neither libibverbs
	// nor sysfs tells GID types). InfiniBand ports, addressed by LID, ignore it.
	GIDIndex int
}

// ConfigFromEnv returns the Config that the environment variables A2A_IB_HCA (HCA) and
// A2A_IB_GID_INDEX (GIDIndex, 0-255; unset: AutoGIDIndex) describe, as a2a's RDMA
// transport reads them. The error of a malformed value matches ErrInvalidArgument.
func ConfigFromEnv() (Config, error) {
	c := Config{HCA: os.Getenv("A2A_IB_HCA"), GIDIndex: AutoGIDIndex}
	if s := os.Getenv("A2A_IB_GID_INDEX"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 255 {
			return c, invalidf("A2A_IB_GID_INDEX=%q: want a GID index 0-255", s)
		}
		c.GIDIndex = n
	}
	if _, err := parseHCA(c.HCA); err != nil {
		return c, err
	}
	return c, nil
}

type hcaFilter struct {
	exclude, exact bool
	entries        []hcaEntry
}

type hcaEntry struct {
	name string
	port int // 0: any
}

func parseHCA(s string) (hcaFilter, error) {
	var f hcaFilter
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "^") {
		f.exclude, s = true, s[1:]
	}
	if strings.HasPrefix(s, "=") {
		f.exact, s = true, s[1:]
	}
	if s == "" {
		return f, nil
	}
	for _, item := range strings.Split(s, ",") {
		name, port, hasPort := strings.Cut(strings.TrimSpace(item), ":")
		e := hcaEntry{name: name}
		if name == "" {
			return f, invalidf("A2A_IB_HCA %q: empty device name", s)
		}
		if hasPort {
			n, err := strconv.Atoi(port)
			if err != nil || n < 1 || n > 255 {
				return f, invalidf("A2A_IB_HCA %q: bad port in %q", s, item)
			}
			e.port = n
		}
		f.entries = append(f.entries, e)
	}
	return f, nil
}

func (f hcaFilter) match(dev string, port int) bool {
	if len(f.entries) == 0 {
		return true
	}
	hit := false
	for _, e := range f.entries {
		nameOK := dev == e.name || (!f.exact && strings.HasPrefix(dev, e.name))
		if nameOK && (e.port == 0 || e.port == port) {
			hit = true
			break
		}
	}
	return hit != f.exclude
}

// Endpoint is a port chosen for traffic and how it is addressed. QP.Init, QP.Connect and
// QP.Addr take the endpoint the QP is used on.
type Endpoint struct {
	Device    string // the device's name, for Lib.Open
	Port      int    // the port number, from 1
	LinkLayer LinkLayer
	GIDIndex  int    // the source GID index for RoCE (GRH); -1 on InfiniBand
	GID       GID    // zero on InfiniBand
	LID       uint16 // the port's LID on InfiniBand
	MTU       MTU    // the port's active MTU
}

// Global says whether packets carry a GRH (RoCE: always; addressed by GID, not LID).
func (e Endpoint) Global() bool { return e.GIDIndex >= 0 }

func (e Endpoint) String() string {
	if e.Global() {
		return fmt.Sprintf("%s:%d gid %d %v mtu %v", e.Device, e.Port, e.GIDIndex, e.GID, e.MTU)
	}
	return fmt.Sprintf("%s:%d lid %d mtu %v", e.Device, e.Port, e.LID, e.MTU)
}

// Endpoints returns the ports cfg selects among devs that can carry traffic, ordered by
// device and port, or an error matching ErrUnavailable that gives each port's reason. A
// port can carry traffic when it is ACTIVE and addressable: on RoCE with the GID cfg
// asks for, on InfiniBand with a LID (a subnet manager runs). Its errors call cfg.HCA and
// cfg.GIDIndex by the variables ConfigFromEnv reads them from, A2A_IB_HCA and
// A2A_IB_GID_INDEX; a malformed cfg.HCA matches ErrInvalidArgument.
func Endpoints(devs []Device, cfg Config) ([]Endpoint, error) {
	f, err := parseHCA(cfg.HCA)
	if err != nil {
		return nil, err
	}
	if len(devs) == 0 {
		return nil, unavailable(nil, "no RDMA device found")
	}
	var out []Endpoint
	var why []string
	for _, d := range devs {
		for _, p := range d.Ports {
			if !f.match(d.Name, p.Num) {
				continue
			}
			ep, reason := endpoint(d.Name, p, cfg.GIDIndex)
			if reason != "" {
				why = append(why, fmt.Sprintf("%s:%d %s", d.Name, p.Num, reason))
				continue
			}
			out = append(out, ep)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	if len(why) == 0 {
		return nil, unavailable(nil, "A2A_IB_HCA=%q selects none of the ports of %s", cfg.HCA, deviceNames(devs))
	}
	return nil, unavailable(nil, "no usable port: %s", strings.Join(why, "; "))
}

func deviceNames(devs []Device) string {
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.Name
	}
	return strings.Join(names, ", ")
}

// endpoint addresses one port, or says why it cannot be used.
func endpoint(dev string, p Port, gidIndex int) (Endpoint, string) {
	if p.State != PortActive {
		return Endpoint{}, "is " + p.State.String()
	}
	ep := Endpoint{Device: dev, Port: p.Num, LinkLayer: p.LinkLayer, GIDIndex: -1, LID: p.LID, MTU: p.ActiveMTU}
	if p.LinkLayer != LinkEthernet {
		if p.LID == 0 {
			return Endpoint{}, "has no LID (is a subnet manager running?)"
		}
		return ep, ""
	}
	i, reason := pickGID(p.GIDs, gidIndex)
	if reason != "" {
		return Endpoint{}, reason
	}
	ep.GIDIndex, ep.GID = p.GIDs[i].Index, p.GIDs[i].GID
	return ep, ""
}

// pickGID returns the position in gids of the GID index forced (>= 0), or of the RoCE v2
// IPv4-mapped GID (an IPv4-mapped GID of unknown type if no type is known).
func pickGID(gids []GIDEntry, force int) (int, string) {
	if force >= 0 {
		for i, g := range gids {
			if g.Index == force {
				return i, ""
			}
		}
		return -1, fmt.Sprintf("has no GID at A2A_IB_GID_INDEX=%d", force)
	}
	fallback := -1
	for i, g := range gids {
		if _, ok := g.GID.IPv4(); !ok {
			continue
		}
		if g.Type == GIDTypeRoCEv2 {
			return i, ""
		}
		if g.Type == GIDTypeUnknown && fallback < 0 {
			fallback = i
		}
	}
	if fallback >= 0 {
		return fallback, ""
	}
	return -1, "has no RoCE v2 IPv4-mapped GID (give its netdev an IPv4 address, or set A2A_IB_GID_INDEX)"
}

// Endpoints describes the library's devices and selects among them (see the function
// Endpoints).
func (l *Lib) Endpoints(cfg Config) ([]Endpoint, error) {
	devs, err := l.Devices()
	if err != nil {
		return nil, err
	}
	return Endpoints(devs, cfg)
}
