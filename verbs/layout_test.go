package verbs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// wantLayout is what rdma-core's <infiniband/verbs.h> (v44, x86-64) says for every
// expression ibvcore.h's table lists; TestLayoutMatchesVerbsH re-derives it from the
// installed header where there is one.
var wantLayout = map[string]int64{
	"sizeof(union ibv_gid)":                             16,
	"sizeof(struct ibv_gid_entry)":                      32,
	"offsetof(struct ibv_gid_entry, gid_type)":          24,
	"offsetof(struct ibv_gid_entry, ndev_ifindex)":      28,
	"sizeof(struct ibv_device_attr)":                    232,
	"offsetof(struct ibv_device_attr, max_qp)":          108,
	"offsetof(struct ibv_device_attr, max_sge)":         120,
	"offsetof(struct ibv_device_attr, max_cqe)":         132,
	"offsetof(struct ibv_device_attr, phys_port_cnt)":   227,
	"sizeof(struct ibv_port_attr)":                      52,
	"offsetof(struct ibv_port_attr, active_mtu)":        8,
	"offsetof(struct ibv_port_attr, gid_tbl_len)":       12,
	"offsetof(struct ibv_port_attr, lid)":               34,
	"offsetof(struct ibv_port_attr, phys_state)":        45,
	"offsetof(struct ibv_port_attr, link_layer)":        46,
	"sizeof(struct ibv_context_ops)":                    256,
	"offsetof(struct ibv_context_ops, poll_cq)":         88,
	"offsetof(struct ibv_context_ops, req_notify_cq)":   96,
	"offsetof(struct ibv_context_ops, post_send)":       200,
	"offsetof(struct ibv_context_ops, post_recv)":       208,
	"offsetof(struct ibv_context, ops)":                 8,
	"offsetof(struct ibv_context, async_fd)":            268,
	"sizeof(struct ibv_mr)":                             48,
	"offsetof(struct ibv_mr, lkey)":                     36,
	"offsetof(struct ibv_mr, rkey)":                     40,
	"offsetof(struct ibv_comp_channel, fd)":             8,
	"offsetof(struct ibv_cq, context)":                  0,
	"offsetof(struct ibv_cq, cqe)":                      28,
	"offsetof(struct ibv_qp, context)":                  0,
	"offsetof(struct ibv_qp, qp_num)":                   52,
	"offsetof(struct ibv_qp, state)":                    56,
	"sizeof(struct ibv_qp_cap)":                         20,
	"sizeof(struct ibv_qp_init_attr)":                   64,
	"offsetof(struct ibv_qp_init_attr, cap)":            32,
	"offsetof(struct ibv_qp_init_attr, qp_type)":        52,
	"sizeof(struct ibv_global_route)":                   24,
	"sizeof(struct ibv_ah_attr)":                        32,
	"offsetof(struct ibv_ah_attr, dlid)":                24,
	"offsetof(struct ibv_ah_attr, is_global)":           29,
	"offsetof(struct ibv_ah_attr, port_num)":            30,
	"sizeof(struct ibv_qp_attr)":                        144,
	"offsetof(struct ibv_qp_attr, dest_qp_num)":         28,
	"offsetof(struct ibv_qp_attr, qp_access_flags)":     32,
	"offsetof(struct ibv_qp_attr, ah_attr)":             56,
	"offsetof(struct ibv_qp_attr, pkey_index)":          120,
	"offsetof(struct ibv_qp_attr, max_rd_atomic)":       126,
	"offsetof(struct ibv_qp_attr, port_num)":            129,
	"offsetof(struct ibv_qp_attr, rnr_retry)":           132,
	"sizeof(struct ibv_sge)":                            16,
	"sizeof(struct ibv_send_wr)":                        128,
	"offsetof(struct ibv_send_wr, opcode)":              28,
	"offsetof(struct ibv_send_wr, imm_data)":            36,
	"offsetof(struct ibv_send_wr, wr.rdma.remote_addr)": 40,
	"offsetof(struct ibv_send_wr, wr.rdma.rkey)":        48,
	"sizeof(struct ibv_recv_wr)":                        32,
	"sizeof(struct ibv_wc)":                             48,
	"offsetof(struct ibv_wc, byte_len)":                 20,
	"offsetof(struct ibv_wc, imm_data)":                 24,
	"offsetof(struct ibv_wc, wc_flags)":                 36,
	"offsetof(struct ibv_wc, dlid_path_bits)":           45,
	"IBV_MTU_1024":               3,
	"IBV_PORT_ACTIVE":            4,
	"IBV_LINK_LAYER_ETHERNET":    2,
	"IBV_GID_TYPE_ROCE_V2":       2,
	"IBV_QPT_RC":                 2,
	"IBV_QPS_RTS":                3,
	"IBV_QPS_ERR":                6,
	"IBV_ACCESS_REMOTE_READ":     4,
	"IBV_QP_AV":                  128,
	"IBV_QP_MIN_RNR_TIMER":       32768,
	"IBV_QP_MAX_DEST_RD_ATOMIC":  131072,
	"IBV_QP_DEST_QPN":            1048576,
	"IBV_WR_RDMA_WRITE_WITH_IMM": 1,
	"IBV_WR_SEND":                2,
	"IBV_WR_SEND_WITH_IMM":       3,
	"IBV_SEND_SIGNALED":          2,
	"IBV_SEND_INLINE":            8,
	"IBV_WC_RECV":                128,
	"IBV_WC_RECV_RDMA_WITH_IMM":  129,
	"IBV_WC_WITH_IMM":            2,
}

func TestLayoutConstants(t *testing.T) {
	if !haveCgo {
		t.Skip("built without cgo: no C declarations to check")
	}
	got := cLayout()
	if len(got) != len(wantLayout) {
		t.Errorf("ibvcore.h's table has %d entries, wantLayout %d", len(got), len(wantLayout))
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range wantLayout {
			if !yield(k) {
				return
			}
		}
	}) {
		if g, ok := got[k]; !ok || g != wantLayout[k] {
			t.Errorf("%s = %d (present %v), verbs.h says %d", k, g, ok, wantLayout[k])
		}
	}
	// The Go mirrors handed to C by pointer, and the Go constants, against the same facts.
	for _, c := range []struct {
		name string
		got  int64
	}{
		{"sizeof(struct ibv_wc)", int64(unsafe.Sizeof(WC{}))},
		{"offsetof(struct ibv_wc, byte_len)", int64(unsafe.Offsetof(WC{}.ByteLen))},
		{"offsetof(struct ibv_wc, imm_data)", int64(unsafe.Offsetof(WC{}.immBE))},
		{"offsetof(struct ibv_wc, wc_flags)", int64(unsafe.Offsetof(WC{}.Flags))},
		{"offsetof(struct ibv_wc, dlid_path_bits)", int64(unsafe.Offsetof(WC{}.DLIDPathBits))},
		{"sizeof(struct ibv_sge)", int64(unsafe.Sizeof(SGE{}))},
		{"sizeof(union ibv_gid)", int64(unsafe.Sizeof(GID{}))},
		{"IBV_MTU_1024", int64(MTU1024)},
		{"IBV_PORT_ACTIVE", int64(PortActive)},
		{"IBV_LINK_LAYER_ETHERNET", int64(LinkEthernet)},
		{"IBV_GID_TYPE_ROCE_V2", int64(GIDTypeRoCEv2)},
		{"IBV_QPT_RC", qptRC},
		{"IBV_QPS_RTS", qpsRTS},
		{"IBV_QPS_ERR", qpsErr},
		{"IBV_ACCESS_REMOTE_READ", int64(AccessRemoteRead)},
		{"IBV_WR_RDMA_WRITE_WITH_IMM", int64(OpRDMAWriteWithImm)},
		{"IBV_WR_SEND", int64(OpSend)},
		{"IBV_WR_SEND_WITH_IMM", int64(OpSendWithImm)},
		{"IBV_SEND_SIGNALED", int64(SendSignaled)},
		{"IBV_SEND_INLINE", int64(SendInline)},
		{"IBV_WC_RECV", int64(WCRecv)},
		{"IBV_WC_RECV_RDMA_WITH_IMM", int64(WCRecvRDMAWithImm)},
		{"IBV_WC_WITH_IMM", int64(WCWithImm)},
	} {
		if w, ok := wantLayout[c.name]; !ok || c.got != w {
			t.Errorf("Go side: %s = %d, verbs.h says %d", c.name, c.got, w)
		}
	}
}

// TestLayoutMatchesVerbsH compiles a C program against the installed verbs.h that prints
// every expression of ibvcore.h's table, and compares. It needs the header (Debian's
// libibverbs-dev, which scripts/rdma-lab.sh installs) and a C compiler; `make test-rdma`
// sets A2A_IBV_HEADERS=1, and then a missing header fails the test instead of skipping it.
func TestLayoutMatchesVerbsH(t *testing.T) {
	if !haveCgo {
		t.Skip("built without cgo")
	}
	const header = "/usr/include/infiniband/verbs.h"
	required := os.Getenv("A2A_IBV_HEADERS") == "1"
	cc, ccErr := exec.LookPath("cc")
	if _, err := os.Stat(header); err != nil || ccErr != nil {
		if required {
			t.Fatalf("A2A_IBV_HEADERS=1 but %s or cc is missing (apt-get install libibverbs-dev gcc)", header)
		}
		t.Skipf("no %s or cc here: make test-rdma checks the layout (A2A_IBV_HEADERS=1)", header)
	}
	names := make([]string, 0, len(wantLayout))
	for k := range cLayout() {
		names = append(names, k)
	}
	slices.Sort(names)
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n")
	for _, n := range names {
		fmt.Fprintf(&src, "\tprintf(\"%%ld\\n\", (long)(%s));\n", n)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "layout.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "layout")
	if out, err := exec.Command(cc, "-o", bin, filepath.Join(dir, "layout.c")).CombinedOutput(); err != nil {
		t.Fatalf("cc against verbs.h: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(bytes.TrimSpace(out)), "\n")
	if len(lines) != len(names) {
		t.Fatalf("%d values for %d expressions", len(lines), len(names))
	}
	ours := cLayout()
	for i, n := range names {
		v, err := strconv.ParseInt(lines[i], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if ours[n] != v {
			t.Errorf("%s: ibvcore.h %d, verbs.h %d", n, ours[n], v)
		}
		if wantLayout[n] != v {
			t.Errorf("%s: wantLayout %d, verbs.h %d", n, wantLayout[n], v)
		}
	}
}
