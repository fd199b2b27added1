package verbs

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestLoadMissingLibraryIsUnavailable(t *testing.T) {
	l, err := LoadLibrary("libibverbs-a2a-test-missing.so.1")
	if l != nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("LoadLibrary(missing) = %v, %v; want ErrUnavailable", l, err)
	}
	if !strings.Contains(err.Error(), "libibverbs-a2a-test-missing.so.1") {
		t.Errorf("error %q does not name the library", err)
	}
}

// A library that exists but is not libibverbs: a descriptive error, not a crash.
func TestLoadWrongLibraryIsUnavailable(t *testing.T) {
	if !haveCgo {
		t.Skip("built without cgo: LoadLibrary cannot get that far")
	}
	_, err := LoadLibrary("libc.so.6")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "ibv_get_device_list@IBVERBS_1.1") {
		t.Fatalf("LoadLibrary(libc) = %v; want ErrUnavailable naming the missing symbol", err)
	}
}

// On a machine without RDMA (the CI host, a laptop) verbs must report itself unavailable,
// with the reason, whether the library is missing or it finds no device. The lab, which has
// devices, sets A2A_RDMA_LAB=1 and runs the tests of lab_test.go instead.
func TestHostWithoutRDMAIsUnavailable(t *testing.T) {
	if os.Getenv("A2A_RDMA_LAB") == "1" {
		t.Skip("in the RDMA lab: the devices exist (lab_test.go checks them)")
	}
	l, err := Load()
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Load() = %v; want ErrUnavailable", err)
		}
		t.Logf("library missing: %v", err)
		return
	}
	devs, err := l.Devices()
	if err != nil {
		// libibverbs says ENOSYS where the kernel has no RDMA support at all (no ib_uverbs).
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Devices() = %v; want ErrUnavailable", err)
		}
		if _, err := l.Open("rxe0"); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Open(rxe0) = %v; want ErrUnavailable", err)
		}
		t.Logf("no kernel support: %v", err)
		return
	}
	if len(devs) > 0 {
		t.Skipf("this host has RDMA devices (%s): nothing unavailable to check", deviceNames(devs))
	}
	eps, err := l.Endpoints(Config{GIDIndex: AutoGIDIndex})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no RDMA device") {
		t.Fatalf("Endpoints() = %v, %v; want ErrUnavailable: no RDMA device", eps, err)
	}
	if _, err := l.Open("rxe0"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open(rxe0) = %v; want ErrUnavailable", err)
	}
}

func TestUnavailableError(t *testing.T) {
	cause := unix.ENOENT
	err := error(&UnavailableError{Reason: "cannot load x", Err: cause})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, unix.ENOENT) {
		t.Fatalf("%v: want ErrUnavailable and its cause", err)
	}
	if got, want := err.Error(), "verbs unavailable: cannot load x: no such file or directory"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestConfigFromEnv(t *testing.T) {
	for _, tc := range []struct {
		hca, gid string
		want     Config
		bad      bool
	}{
		{want: Config{GIDIndex: AutoGIDIndex}},
		{hca: "mlx5_0:1,mlx5_1", gid: "3", want: Config{HCA: "mlx5_0:1,mlx5_1", GIDIndex: 3}},
		{gid: "x", bad: true},
		{gid: "256", bad: true},
		{hca: "mlx5_0:zero", bad: true},
		{hca: "^=,", bad: true},
	} {
		t.Setenv("A2A_IB_HCA", tc.hca)
		t.Setenv("A2A_IB_GID_INDEX", tc.gid)
		got, err := ConfigFromEnv()
		if tc.bad {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("HCA=%q GID=%q: err %v, want ErrInvalidArgument", tc.hca, tc.gid, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("HCA=%q GID=%q: %+v, %v; want %+v", tc.hca, tc.gid, got, err, tc.want)
		}
	}
}

func TestHCAFilter(t *testing.T) {
	for _, tc := range []struct {
		spec string
		dev  string
		port int
		want bool
	}{
		{"", "mlx5_0", 1, true},
		{"mlx5", "mlx5_0", 1, true},
		{"mlx5", "rxe0", 1, false},
		{"=mlx5", "mlx5_0", 1, false},
		{"=mlx5_0", "mlx5_0", 2, true},
		{"mlx5_0:1", "mlx5_0", 2, false},
		{"mlx5_0:2,rxe", "mlx5_0", 2, true},
		{"mlx5_0:2,rxe", "rxe1", 1, true},
		{"^rxe1", "rxe1", 1, false},
		{"^rxe1", "rxe0", 1, true},
		{"^=rxe", "rxe0", 1, true},
		{"^rxe0:1", "rxe0", 2, true},
	} {
		f, err := parseHCA(tc.spec)
		if err != nil {
			t.Fatalf("parseHCA(%q): %v", tc.spec, err)
		}
		if got := f.match(tc.dev, tc.port); got != tc.want {
			t.Errorf("A2A_IB_HCA=%q matches %s:%d = %v, want %v", tc.spec, tc.dev, tc.port, got, tc.want)
		}
	}
}

func gid(s string) GID {
	return GID(netip.MustParseAddr(s).As16())
}

// The RoCE table of an rxe port with an IPv4 address: link-local GIDs first.
func roceGIDs(v4 string) []GIDEntry {
	return []GIDEntry{
		{Index: 0, GID: gid("fe80::1"), Type: GIDTypeRoCEv1},
		{Index: 1, GID: gid("fe80::1"), Type: GIDTypeRoCEv2},
		{Index: 2, GID: gid("::ffff:" + v4), Type: GIDTypeRoCEv1},
		{Index: 3, GID: gid("::ffff:" + v4), Type: GIDTypeRoCEv2},
	}
}

func TestEndpoints(t *testing.T) {
	rxe := func(name, v4 string, state PortState) Device {
		return Device{Name: name, Ports: []Port{{Num: 1, State: state, LinkLayer: LinkEthernet,
			ActiveMTU: MTU1024, GIDs: roceGIDs(v4)}}}
	}
	ib := Device{Name: "mlx5_0", Ports: []Port{
		{Num: 1, State: PortActive, LinkLayer: LinkInfiniBand, ActiveMTU: MTU4096, LID: 7},
		{Num: 2, State: PortActive, LinkLayer: LinkInfiniBand, ActiveMTU: MTU4096},
	}}
	noV4 := Device{Name: "rxe9", Ports: []Port{{Num: 1, State: PortActive, LinkLayer: LinkEthernet,
		GIDs: roceGIDs("10.0.0.1")[:2]}}}
	unknownType := Device{Name: "rxe8", Ports: []Port{{Num: 1, State: PortActive, LinkLayer: LinkEthernet,
		GIDs: []GIDEntry{{Index: 0, GID: gid("fe80::2"), Type: GIDTypeUnknown},
			{Index: 5, GID: gid("::ffff:10.0.0.8"), Type: GIDTypeUnknown}}}}}
	devs := []Device{rxe("rxe0", "10.77.0.1", PortActive), rxe("rxe1", "10.77.0.2", PortActive)}

	for _, tc := range []struct {
		name    string
		devs    []Device
		cfg     Config
		want    []string // Endpoint.String()s
		wantErr string   // substring of an ErrUnavailable error
	}{
		{"roce v2 ipv4 gid by default", devs, Config{GIDIndex: AutoGIDIndex},
			[]string{"rxe0:1 gid 3 ::ffff:10.77.0.1 mtu 1024", "rxe1:1 gid 3 ::ffff:10.77.0.2 mtu 1024"}, ""},
		{"hca filter", devs, Config{HCA: "rxe1", GIDIndex: AutoGIDIndex},
			[]string{"rxe1:1 gid 3 ::ffff:10.77.0.2 mtu 1024"}, ""},
		{"gid index forced", devs, Config{HCA: "=rxe0", GIDIndex: 1},
			[]string{"rxe0:1 gid 1 fe80::1 mtu 1024"}, ""},
		{"gid index missing", devs, Config{HCA: "rxe0", GIDIndex: 9}, nil, "rxe0:1 has no GID at A2A_IB_GID_INDEX=9"},
		{"infiniband uses the lid", []Device{ib}, Config{GIDIndex: AutoGIDIndex},
			[]string{"mlx5_0:1 lid 7 mtu 4096"}, ""},
		{"port down", []Device{rxe("rxe0", "10.77.0.1", PortDown)}, Config{GIDIndex: AutoGIDIndex}, nil, "rxe0:1 is DOWN"},
		{"no ipv4 gid", []Device{noV4}, Config{GIDIndex: AutoGIDIndex}, nil, "rxe9:1 has no RoCE v2 IPv4-mapped GID"},
		{"ipv4 gid of unknown type", []Device{unknownType}, Config{GIDIndex: AutoGIDIndex},
			[]string{"rxe8:1 gid 5 ::ffff:10.0.0.8 mtu invalid(0)"}, ""},
		{"filter selects nothing", devs, Config{HCA: "mlx5", GIDIndex: AutoGIDIndex}, nil, `A2A_IB_HCA="mlx5" selects none`},
		{"no devices", nil, Config{GIDIndex: AutoGIDIndex}, nil, "no RDMA device found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps, err := Endpoints(tc.devs, tc.cfg)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v; want ErrUnavailable containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range eps {
				got = append(got, e.String())
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("endpoints %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMTUAndGID(t *testing.T) {
	for m, want := range map[MTU]int{MTU256: 256, MTU1024: 1024, MTU4096: 4096, 0: 0, 6: 0} {
		if got := m.Bytes(); got != want {
			t.Errorf("MTU(%d).Bytes() = %d, want %d", m, got, want)
		}
	}
	g := gid("::ffff:10.77.0.2")
	if a, ok := g.IPv4(); !ok || a.String() != "10.77.0.2" {
		t.Errorf("IPv4() = %v, %v", a, ok)
	}
	if _, ok := gid("fe80::1").IPv4(); ok {
		t.Error("fe80::1 is not IPv4-mapped")
	}
	if g.String() != "::ffff:10.77.0.2" {
		t.Errorf("String() = %q", g.String())
	}
}

// The immediate travels in network order: WC.Imm and SendWR.Imm are host order.
func TestImmByteOrder(t *testing.T) {
	w := WC{immBE: htonl(0x01020304)}
	if w.Imm() != 0x01020304 {
		t.Fatalf("Imm() = %#x", w.Imm())
	}
	b := (*[4]byte)(unsafe.Pointer(&w.immBE))
	if *b != [4]byte{1, 2, 3, 4} {
		t.Fatalf("immBE bytes %v, want big-endian 1 2 3 4", *b)
	}
}

func TestWCErr(t *testing.T) {
	w := WC{ID: 7, Status: WCRetryExcErr, QPNum: 17}
	var we *WCError
	if err := w.Err(); !errors.As(err, &we) || we.Status != WCRetryExcErr ||
		!strings.Contains(err.Error(), "transport retry counter exceeded") {
		t.Fatalf("Err() = %v", err)
	}
	if (&WC{}).Err() != nil {
		t.Fatal("a successful completion has no error")
	}
}

func TestCheckMemlock(t *testing.T) {
	if hasCapIPCLock() {
		// The kernel ignores the limit with CAP_IPC_LOCK (root): nothing can be too much.
		if err := CheckMemlock(1 << 50); err != nil {
			t.Fatalf("with CAP_IPC_LOCK: %v", err)
		}
		return
	}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = 64 << 10
	if old.Max != unix.RLIM_INFINITY && old.Max < low.Cur {
		low.Cur = old.Max
	}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &low); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old)
	if err := CheckMemlock(low.Cur); err != nil {
		t.Errorf("need = limit: %v", err)
	}
	err := CheckMemlock(low.Cur + 1<<20)
	if !errors.Is(err, ErrMemlock) || !strings.Contains(err.Error(), "ulimit -l") {
		t.Errorf("need > limit: %v; want ErrMemlock with advice", err)
	}
}
