//go:build cgo

package verbs

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include "ibvcore.h"

// The exported functions of libibverbs we call, resolved with dlvsym at the versions
// rdma-core exports them under (IBVERBS_1.1, the comp channel ones IBVERBS_1.0), as NCCL's
// ibvwrap does: a bare dlsym could bind the IBVERBS_1.0 compat entry points.
struct a2a_ibv_fns {
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
	// the exported ibv_query_port (verbs.h wraps it in a static inline ___ibv_query_port)
	int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
	int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
	// optional (IBVERBS_1.11): all valid GIDs with their types in one call
	ssize_t (*query_gid_table)(struct ibv_context *ctx, struct ibv_gid_entry *entries,
				   size_t max, uint32_t flags, size_t entry_size);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	// the exported ibv_reg_mr (verbs.h's ibv_reg_mr macro picks it for plain access flags)
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
	int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
				    struct ibv_comp_channel *ch, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
};

// a2a_ibv_load opens the library and fills f; on failure it returns -1 with the reason in err.
static int a2a_ibv_load(const char *name, struct a2a_ibv_fns *f, char *err, size_t errlen) {
	void *h = dlopen(name, RTLD_NOW);
	if (!h) {
		snprintf(err, errlen, "%s", dlerror());
		return -1;
	}
#define A2A_SYM(field, sym, ver)                                                        \
	do {                                                                            \
		*(void **)&f->field = dlvsym(h, sym, ver);                              \
		if (!f->field) {                                                        \
			snprintf(err, errlen, "%s has no %s@%s", name, sym, ver);       \
			return -1;                                                      \
		}                                                                       \
	} while (0)
	A2A_SYM(get_device_list, "ibv_get_device_list", "IBVERBS_1.1");
	A2A_SYM(free_device_list, "ibv_free_device_list", "IBVERBS_1.1");
	A2A_SYM(get_device_name, "ibv_get_device_name", "IBVERBS_1.1");
	A2A_SYM(open_device, "ibv_open_device", "IBVERBS_1.1");
	A2A_SYM(close_device, "ibv_close_device", "IBVERBS_1.1");
	A2A_SYM(query_device, "ibv_query_device", "IBVERBS_1.1");
	A2A_SYM(query_port, "ibv_query_port", "IBVERBS_1.1");
	A2A_SYM(query_gid, "ibv_query_gid", "IBVERBS_1.1");
	A2A_SYM(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1");
	A2A_SYM(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1");
	A2A_SYM(reg_mr, "ibv_reg_mr", "IBVERBS_1.1");
	A2A_SYM(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1");
	A2A_SYM(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0");
	A2A_SYM(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0");
	A2A_SYM(create_cq, "ibv_create_cq", "IBVERBS_1.1");
	A2A_SYM(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1");
	A2A_SYM(create_qp, "ibv_create_qp", "IBVERBS_1.1");
	A2A_SYM(modify_qp, "ibv_modify_qp", "IBVERBS_1.1");
	A2A_SYM(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1");
	A2A_SYM(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1");
	A2A_SYM(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1");
#undef A2A_SYM
	*(void **)&f->query_gid_table = dlvsym(h, "_ibv_query_gid_table", "IBVERBS_1.11");
	// The handle is never closed: providers and contexts may outlive any one user.
	return 0;
}

static struct ibv_device **a2a_get_device_list(struct a2a_ibv_fns *f, int *n) {
	errno = 0;
	return f->get_device_list(n);
}
static struct ibv_device *a2a_device_at(struct ibv_device **l, int i) { return l[i]; }
static void a2a_free_device_list(struct a2a_ibv_fns *f, struct ibv_device **l) { f->free_device_list(l); }
static const char *a2a_device_name(struct a2a_ibv_fns *f, struct ibv_device *d) { return f->get_device_name(d); }
static struct ibv_context *a2a_open_device(struct a2a_ibv_fns *f, struct ibv_device *d) {
	errno = 0;
	return f->open_device(d);
}
static int a2a_close_device(struct a2a_ibv_fns *f, struct ibv_context *c) { return f->close_device(c); }
static int a2a_query_device(struct a2a_ibv_fns *f, struct ibv_context *c, struct ibv_device_attr *a) {
	memset(a, 0, sizeof *a);
	return f->query_device(c, a);
}

// Room for fields later rdma-core versions may append to ibv_port_attr: the exported
// ibv_query_port fills the provider's idea of the struct.
union a2a_port_attr {
	struct ibv_port_attr a;
	char pad[256];
};
static int a2a_query_port(struct a2a_ibv_fns *f, struct ibv_context *c, uint8_t port, struct ibv_port_attr *out) {
	union a2a_port_attr u;
	memset(&u, 0, sizeof u);
	int rc = f->query_port(c, port, &u.a);
	*out = u.a;
	return rc;
}
static int a2a_query_gid(struct a2a_ibv_fns *f, struct ibv_context *c, uint8_t port, int idx, union ibv_gid *g) {
	return f->query_gid(c, port, idx, g);
}
static int a2a_has_gid_table(struct a2a_ibv_fns *f) { return f->query_gid_table != NULL; }
static ssize_t a2a_query_gid_table(struct a2a_ibv_fns *f, struct ibv_context *c, struct ibv_gid_entry *e, size_t max) {
	return f->query_gid_table(c, e, max, 0, sizeof *e);
}
static struct ibv_pd *a2a_alloc_pd(struct a2a_ibv_fns *f, struct ibv_context *c) {
	errno = 0;
	return f->alloc_pd(c);
}
static int a2a_dealloc_pd(struct a2a_ibv_fns *f, struct ibv_pd *p) { return f->dealloc_pd(p); }
static struct ibv_mr *a2a_reg_mr(struct a2a_ibv_fns *f, struct ibv_pd *p, uintptr_t addr, size_t len, int access) {
	errno = 0;
	return f->reg_mr(p, (void *)addr, len, access);
}
static int a2a_dereg_mr(struct a2a_ibv_fns *f, struct ibv_mr *m) { return f->dereg_mr(m); }
static struct ibv_comp_channel *a2a_create_comp_channel(struct a2a_ibv_fns *f, struct ibv_context *c) {
	errno = 0;
	return f->create_comp_channel(c);
}
static int a2a_destroy_comp_channel(struct a2a_ibv_fns *f, struct ibv_comp_channel *ch) { return f->destroy_comp_channel(ch); }
static struct ibv_cq *a2a_create_cq(struct a2a_ibv_fns *f, struct ibv_context *c, int cqe, struct ibv_comp_channel *ch) {
	errno = 0;
	return f->create_cq(c, cqe, NULL, ch, 0);
}
static int a2a_destroy_cq(struct a2a_ibv_fns *f, struct ibv_cq *cq) { return f->destroy_cq(cq); }
static struct ibv_cq *a2a_get_cq_event(struct a2a_ibv_fns *f, struct ibv_comp_channel *ch) {
	struct ibv_cq *cq = NULL;
	void *ctx;
	errno = 0;
	if (f->get_cq_event(ch, &cq, &ctx))
		return NULL;
	return cq;
}
static void a2a_ack_cq_events(struct a2a_ibv_fns *f, struct ibv_cq *cq, unsigned int n) { f->ack_cq_events(cq, n); }

static struct ibv_qp *a2a_create_qp(struct a2a_ibv_fns *f, struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
				    int type, struct ibv_qp_cap *cap) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = type;
	a.cap = *cap;
	errno = 0;
	struct ibv_qp *qp = f->create_qp(pd, &a);
	if (qp)
		*cap = a.cap; // what the provider granted
	return qp;
}
static int a2a_modify_qp(struct a2a_ibv_fns *f, struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
	return f->modify_qp(qp, a, mask);
}
static int a2a_destroy_qp(struct a2a_ibv_fns *f, struct ibv_qp *qp) { return f->destroy_qp(qp); }

// The static inline verbs of verbs.h, through the context's ops as their bodies do.
static int a2a_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return cq->context->ops.poll_cq(cq, n, wc); }
static int a2a_req_notify_cq(struct ibv_cq *cq, int solicited) { return cq->context->ops.req_notify_cq(cq, solicited); }
static int a2a_post_send(struct ibv_qp *qp, uint64_t id, int opcode, unsigned int flags, uint32_t imm_be,
			 uint64_t raddr, uint32_t rkey, struct ibv_sge *sg, int nsge) {
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = sg;
	wr.num_sge = nsge;
	wr.opcode = opcode;
	wr.send_flags = flags;
	wr.imm_data = imm_be;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return qp->context->ops.post_send(qp, &wr, &bad);
}
static int a2a_post_recv(struct ibv_qp *qp, uint64_t id, struct ibv_sge *sg, int nsge) {
	struct ibv_recv_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = sg;
	wr.num_sge = nsge;
	return qp->context->ops.post_recv(qp, &wr, &bad);
}
// n receive WRs, WR i with the one SGE sg[i], posted as chains of up to 32.
static int a2a_post_recvs(struct ibv_qp *qp, uint64_t *ids, struct ibv_sge *sg, int n) {
	struct ibv_recv_wr wrs[32], *bad = NULL;
	for (int base = 0; base < n; base += 32) {
		int k = n - base < 32 ? n - base : 32;
		for (int i = 0; i < k; i++) {
			wrs[i].wr_id = ids[base + i];
			wrs[i].next = i + 1 < k ? &wrs[i + 1] : NULL;
			wrs[i].sg_list = &sg[base + i];
			wrs[i].num_sge = 1;
		}
		int rc = qp->context->ops.post_recv(qp, wrs, &bad);
		if (rc)
			return rc;
	}
	return 0;
}

#define A2A_OFF(t, f) (long)offsetof(struct t, f)
#define A2A_SIZE(t) (long)sizeof(struct t)
// Sizes, offsets and enum values of this file's declarations, for the layout tests.
static long a2a_layout(int i, const char **name) {
	static const struct { const char *n; long v; } t[] = {
		{"sizeof(union ibv_gid)", (long)sizeof(union ibv_gid)},
		{"sizeof(struct ibv_gid_entry)", A2A_SIZE(ibv_gid_entry)},
		{"offsetof(struct ibv_gid_entry, gid_type)", A2A_OFF(ibv_gid_entry, gid_type)},
		{"offsetof(struct ibv_gid_entry, ndev_ifindex)", A2A_OFF(ibv_gid_entry, ndev_ifindex)},
		{"sizeof(struct ibv_device_attr)", A2A_SIZE(ibv_device_attr)},
		{"offsetof(struct ibv_device_attr, max_qp)", A2A_OFF(ibv_device_attr, max_qp)},
		{"offsetof(struct ibv_device_attr, max_sge)", A2A_OFF(ibv_device_attr, max_sge)},
		{"offsetof(struct ibv_device_attr, max_cqe)", A2A_OFF(ibv_device_attr, max_cqe)},
		{"offsetof(struct ibv_device_attr, phys_port_cnt)", A2A_OFF(ibv_device_attr, phys_port_cnt)},
		{"sizeof(struct ibv_port_attr)", A2A_SIZE(ibv_port_attr)},
		{"offsetof(struct ibv_port_attr, active_mtu)", A2A_OFF(ibv_port_attr, active_mtu)},
		{"offsetof(struct ibv_port_attr, gid_tbl_len)", A2A_OFF(ibv_port_attr, gid_tbl_len)},
		{"offsetof(struct ibv_port_attr, lid)", A2A_OFF(ibv_port_attr, lid)},
		{"offsetof(struct ibv_port_attr, phys_state)", A2A_OFF(ibv_port_attr, phys_state)},
		{"offsetof(struct ibv_port_attr, link_layer)", A2A_OFF(ibv_port_attr, link_layer)},
		{"sizeof(struct ibv_context_ops)", A2A_SIZE(ibv_context_ops)},
		{"offsetof(struct ibv_context_ops, poll_cq)", A2A_OFF(ibv_context_ops, poll_cq)},
		{"offsetof(struct ibv_context_ops, req_notify_cq)", A2A_OFF(ibv_context_ops, req_notify_cq)},
		{"offsetof(struct ibv_context_ops, post_send)", A2A_OFF(ibv_context_ops, post_send)},
		{"offsetof(struct ibv_context_ops, post_recv)", A2A_OFF(ibv_context_ops, post_recv)},
		{"offsetof(struct ibv_context, ops)", A2A_OFF(ibv_context, ops)},
		{"offsetof(struct ibv_context, async_fd)", A2A_OFF(ibv_context, async_fd)},
		{"sizeof(struct ibv_mr)", A2A_SIZE(ibv_mr)},
		{"offsetof(struct ibv_mr, lkey)", A2A_OFF(ibv_mr, lkey)},
		{"offsetof(struct ibv_mr, rkey)", A2A_OFF(ibv_mr, rkey)},
		{"offsetof(struct ibv_comp_channel, fd)", A2A_OFF(ibv_comp_channel, fd)},
		{"offsetof(struct ibv_cq, context)", A2A_OFF(ibv_cq, context)},
		{"offsetof(struct ibv_cq, cqe)", A2A_OFF(ibv_cq, cqe)},
		{"offsetof(struct ibv_qp, context)", A2A_OFF(ibv_qp, context)},
		{"offsetof(struct ibv_qp, qp_num)", A2A_OFF(ibv_qp, qp_num)},
		{"offsetof(struct ibv_qp, state)", A2A_OFF(ibv_qp, state)},
		{"sizeof(struct ibv_qp_cap)", A2A_SIZE(ibv_qp_cap)},
		{"sizeof(struct ibv_qp_init_attr)", A2A_SIZE(ibv_qp_init_attr)},
		{"offsetof(struct ibv_qp_init_attr, cap)", A2A_OFF(ibv_qp_init_attr, cap)},
		{"offsetof(struct ibv_qp_init_attr, qp_type)", A2A_OFF(ibv_qp_init_attr, qp_type)},
		{"sizeof(struct ibv_global_route)", A2A_SIZE(ibv_global_route)},
		{"sizeof(struct ibv_ah_attr)", A2A_SIZE(ibv_ah_attr)},
		{"offsetof(struct ibv_ah_attr, dlid)", A2A_OFF(ibv_ah_attr, dlid)},
		{"offsetof(struct ibv_ah_attr, is_global)", A2A_OFF(ibv_ah_attr, is_global)},
		{"offsetof(struct ibv_ah_attr, port_num)", A2A_OFF(ibv_ah_attr, port_num)},
		{"sizeof(struct ibv_qp_attr)", A2A_SIZE(ibv_qp_attr)},
		{"offsetof(struct ibv_qp_attr, dest_qp_num)", A2A_OFF(ibv_qp_attr, dest_qp_num)},
		{"offsetof(struct ibv_qp_attr, qp_access_flags)", A2A_OFF(ibv_qp_attr, qp_access_flags)},
		{"offsetof(struct ibv_qp_attr, ah_attr)", A2A_OFF(ibv_qp_attr, ah_attr)},
		{"offsetof(struct ibv_qp_attr, pkey_index)", A2A_OFF(ibv_qp_attr, pkey_index)},
		{"offsetof(struct ibv_qp_attr, max_rd_atomic)", A2A_OFF(ibv_qp_attr, max_rd_atomic)},
		{"offsetof(struct ibv_qp_attr, port_num)", A2A_OFF(ibv_qp_attr, port_num)},
		{"offsetof(struct ibv_qp_attr, rnr_retry)", A2A_OFF(ibv_qp_attr, rnr_retry)},
		{"sizeof(struct ibv_sge)", A2A_SIZE(ibv_sge)},
		{"sizeof(struct ibv_send_wr)", A2A_SIZE(ibv_send_wr)},
		{"offsetof(struct ibv_send_wr, opcode)", A2A_OFF(ibv_send_wr, opcode)},
		{"offsetof(struct ibv_send_wr, imm_data)", A2A_OFF(ibv_send_wr, imm_data)},
		{"offsetof(struct ibv_send_wr, wr.rdma.remote_addr)", A2A_OFF(ibv_send_wr, wr.rdma.remote_addr)},
		{"offsetof(struct ibv_send_wr, wr.rdma.rkey)", A2A_OFF(ibv_send_wr, wr.rdma.rkey)},
		{"sizeof(struct ibv_recv_wr)", A2A_SIZE(ibv_recv_wr)},
		{"sizeof(struct ibv_wc)", A2A_SIZE(ibv_wc)},
		{"offsetof(struct ibv_wc, byte_len)", A2A_OFF(ibv_wc, byte_len)},
		{"offsetof(struct ibv_wc, imm_data)", A2A_OFF(ibv_wc, imm_data)},
		{"offsetof(struct ibv_wc, wc_flags)", A2A_OFF(ibv_wc, wc_flags)},
		{"offsetof(struct ibv_wc, dlid_path_bits)", A2A_OFF(ibv_wc, dlid_path_bits)},
		{"IBV_MTU_1024", IBV_MTU_1024},
		{"IBV_PORT_ACTIVE", IBV_PORT_ACTIVE},
		{"IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET},
		{"IBV_GID_TYPE_ROCE_V2", IBV_GID_TYPE_ROCE_V2},
		{"IBV_QPT_RC", IBV_QPT_RC},
		{"IBV_QPS_RTS", IBV_QPS_RTS},
		{"IBV_QPS_ERR", IBV_QPS_ERR},
		{"IBV_ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ},
		{"IBV_QP_AV", IBV_QP_AV},
		{"IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER},
		{"IBV_QP_MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC},
		{"IBV_QP_DEST_QPN", IBV_QP_DEST_QPN},
		{"IBV_WR_RDMA_WRITE_WITH_IMM", IBV_WR_RDMA_WRITE_WITH_IMM},
		{"IBV_WR_SEND", IBV_WR_SEND},
		{"IBV_WR_SEND_WITH_IMM", IBV_WR_SEND_WITH_IMM},
		{"IBV_SEND_SIGNALED", IBV_SEND_SIGNALED},
		{"IBV_SEND_INLINE", IBV_SEND_INLINE},
		{"IBV_WC_RECV", IBV_WC_RECV},
		{"IBV_WC_RECV_RDMA_WITH_IMM", IBV_WC_RECV_RDMA_WITH_IMM},
		{"IBV_WC_WITH_IMM", IBV_WC_WITH_IMM},
	};
	if (i < 0 || i >= (int)(sizeof t / sizeof t[0]))
		return -1;
	*name = t[i].n;
	return t[i].v;
}
*/
import "C"

import (
	"syscall"
	"unsafe"
)

// The Go mirrors of the structs passed to C by pointer must match them exactly.
var (
	_ [unsafe.Sizeof(WC{}) - C.sizeof_struct_ibv_wc]byte
	_ [C.sizeof_struct_ibv_wc - unsafe.Sizeof(WC{})]byte
	_ [unsafe.Sizeof(SGE{}) - C.sizeof_struct_ibv_sge]byte
	_ [C.sizeof_struct_ibv_sge - unsafe.Sizeof(SGE{})]byte
	_ [unsafe.Sizeof(GID{}) - C.sizeof_union_ibv_gid]byte
	_ [C.sizeof_union_ibv_gid - unsafe.Sizeof(GID{})]byte
)

const haveCgo = true

type (
	cFns     = C.struct_a2a_ibv_fns
	cContext = C.struct_ibv_context
	cPD      = C.struct_ibv_pd
	cMR      = C.struct_ibv_mr
	cChannel = C.struct_ibv_comp_channel
	cCQ      = C.struct_ibv_cq
	cQP      = C.struct_ibv_qp
	cDevice  = C.struct_ibv_device
)

// errnoOr returns err when it is a non-zero errno, else fallback: a NULL return without an
// errno still has to be an error.
func errnoOr(err error, fallback syscall.Errno) error {
	if e, ok := err.(syscall.Errno); ok && e != 0 {
		return e
	}
	return fallback
}

// rcErr turns a verbs return code (0, or an errno value; some paths return -1 with errno set)
// into an error.
func rcErr(rc C.int, err error) error {
	switch {
	case rc == 0:
		return nil
	case rc > 0:
		return syscall.Errno(rc)
	default:
		return errnoOr(err, syscall.EIO)
	}
}

func cLoad(name string) (*cFns, string) {
	f := (*cFns)(C.calloc(1, C.size_t(unsafe.Sizeof(cFns{}))))
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var buf [512]C.char
	if C.a2a_ibv_load(cname, f, &buf[0], C.size_t(len(buf))) != 0 {
		C.free(unsafe.Pointer(f))
		return nil, C.GoString(&buf[0])
	}
	return f, ""
}

// cDevices lists the devices: names and handles valid until cFreeDevices(list).
func cDevices(f *cFns) (list unsafe.Pointer, devs []*cDevice, names []string, err error) {
	var n C.int
	l, err := C.a2a_get_device_list(f, &n)
	if l == nil {
		return nil, nil, nil, errnoOr(err, syscall.ENODEV)
	}
	for i := 0; i < int(n); i++ {
		d := C.a2a_device_at(l, C.int(i))
		devs = append(devs, d)
		names = append(names, C.GoString(C.a2a_device_name(f, d)))
	}
	return unsafe.Pointer(l), devs, names, nil
}

func cFreeDevices(f *cFns, list unsafe.Pointer) {
	C.a2a_free_device_list(f, (**C.struct_ibv_device)(list))
}

func cOpenDevice(f *cFns, d *cDevice) (*cContext, error) {
	c, err := C.a2a_open_device(f, d)
	if c == nil {
		return nil, errnoOr(err, syscall.ENODEV)
	}
	return c, nil
}

func cCloseDevice(f *cFns, c *cContext) error {
	rc, err := C.a2a_close_device(f, c)
	return rcErr(rc, err)
}

func cQueryDevice(f *cFns, c *cContext) (deviceAttr, error) {
	var a C.struct_ibv_device_attr
	rc, err := C.a2a_query_device(f, c, &a)
	if err := rcErr(rc, err); err != nil {
		return deviceAttr{}, err
	}
	return deviceAttr{
		fwVer:       C.GoString(&a.fw_ver[0]),
		nodeGUID:    uint64(a.node_guid),
		vendorID:    uint32(a.vendor_id),
		partID:      uint32(a.vendor_part_id),
		maxQP:       int(a.max_qp),
		maxQPWR:     int(a.max_qp_wr),
		maxSGE:      int(a.max_sge),
		maxCQ:       int(a.max_cq),
		maxCQE:      int(a.max_cqe),
		maxMR:       int(a.max_mr),
		maxMRSize:   uint64(a.max_mr_size),
		physPortCnt: int(a.phys_port_cnt),
	}, nil
}

func cQueryPort(f *cFns, c *cContext, port int) (portAttr, error) {
	var a C.struct_ibv_port_attr
	rc, err := C.a2a_query_port(f, c, C.uint8_t(port), &a)
	if err := rcErr(rc, err); err != nil {
		return portAttr{}, err
	}
	return portAttr{
		state:     PortState(a.state),
		maxMTU:    MTU(a.max_mtu),
		activeMTU: MTU(a.active_mtu),
		gidTblLen: int(a.gid_tbl_len),
		lid:       uint16(a.lid),
		physState: PhysState(a.phys_state),
		linkLayer: LinkLayer(a.link_layer),
	}, nil
}

func cQueryGID(f *cFns, c *cContext, port, index int) (GID, error) {
	var g GID
	rc, err := C.a2a_query_gid(f, c, C.uint8_t(port), C.int(index), (*C.union_ibv_gid)(unsafe.Pointer(&g)))
	return g, rcErr(rc, err)
}

// cGIDTable returns every valid GID of the context in one call, or ok=false when this
// libibverbs lacks _ibv_query_gid_table.
func cGIDTable(f *cFns, c *cContext, max int) (entries []gidTableEntry, ok bool, err error) {
	if C.a2a_has_gid_table(f) == 0 || max <= 0 {
		return nil, false, nil
	}
	buf := (*C.struct_ibv_gid_entry)(C.calloc(C.size_t(max), C.size_t(C.sizeof_struct_ibv_gid_entry)))
	defer C.free(unsafe.Pointer(buf))
	n := C.a2a_query_gid_table(f, c, buf, C.size_t(max))
	if n < 0 {
		return nil, true, syscall.Errno(-n)
	}
	for _, e := range unsafe.Slice(buf, int(n)) {
		entries = append(entries, gidTableEntry{
			gid:     *(*GID)(unsafe.Pointer(&e.gid)),
			index:   int(e.gid_index),
			port:    int(e.port_num),
			typ:     GIDType(e.gid_type),
			ifindex: int(e.ndev_ifindex),
		})
	}
	return entries, true, nil
}

func cAllocPD(f *cFns, c *cContext) (*cPD, error) {
	p, err := C.a2a_alloc_pd(f, c)
	if p == nil {
		return nil, errnoOr(err, syscall.ENOMEM)
	}
	return p, nil
}

func cDeallocPD(f *cFns, p *cPD) error {
	rc, err := C.a2a_dealloc_pd(f, p)
	return rcErr(rc, err)
}

func cRegMR(f *cFns, p *cPD, addr uintptr, n int, access Access) (*cMR, uint32, uint32, error) {
	m, err := C.a2a_reg_mr(f, p, C.uintptr_t(addr), C.size_t(n), C.int(access))
	if m == nil {
		return nil, 0, 0, errnoOr(err, syscall.ENOMEM)
	}
	return m, uint32(m.lkey), uint32(m.rkey), nil
}

func cDeregMR(f *cFns, m *cMR) error {
	rc, err := C.a2a_dereg_mr(f, m)
	return rcErr(rc, err)
}

func cCreateCompChannel(f *cFns, c *cContext) (*cChannel, int, error) {
	ch, err := C.a2a_create_comp_channel(f, c)
	if ch == nil {
		return nil, -1, errnoOr(err, syscall.ENOMEM)
	}
	return ch, int(ch.fd), nil
}

func cDestroyCompChannel(f *cFns, ch *cChannel) error {
	rc, err := C.a2a_destroy_comp_channel(f, ch)
	return rcErr(rc, err)
}

func cCreateCQ(f *cFns, c *cContext, cqe int, ch *cChannel) (*cCQ, int, error) {
	cq, err := C.a2a_create_cq(f, c, C.int(cqe), ch)
	if cq == nil {
		return nil, 0, errnoOr(err, syscall.ENOMEM)
	}
	return cq, int(cq.cqe), nil
}

func cDestroyCQ(f *cFns, cq *cCQ) error {
	rc, err := C.a2a_destroy_cq(f, cq)
	return rcErr(rc, err)
}

// cGetCQEvent reads one event from the (non-blocking) channel and acknowledges it at once,
// so that destroying the CQ never waits for an unacknowledged event.
func cGetCQEvent(f *cFns, ch *cChannel) (*cCQ, error) {
	cq, err := C.a2a_get_cq_event(f, ch)
	if cq == nil {
		return nil, errnoOr(err, syscall.EAGAIN)
	}
	C.a2a_ack_cq_events(f, cq, 1)
	return cq, nil
}

func cReqNotifyCQ(cq *cCQ, solicitedOnly bool) error {
	s := C.int(0)
	if solicitedOnly {
		s = 1
	}
	rc, err := C.a2a_req_notify_cq(cq, s)
	return rcErr(rc, err)
}

func cPollCQ(cq *cCQ, wc []WC) (int, error) {
	if len(wc) == 0 {
		return 0, nil
	}
	n := C.a2a_poll_cq(cq, C.int(len(wc)), (*C.struct_ibv_wc)(unsafe.Pointer(&wc[0])))
	if n < 0 {
		return 0, syscall.EIO
	}
	return int(n), nil
}

func cCreateQP(f *cFns, p *cPD, scq, rcq *cCQ, typ int, caps QPCaps) (*cQP, uint32, QPCaps, error) {
	c := C.struct_ibv_qp_cap{
		max_send_wr:     C.uint32_t(caps.MaxSendWR),
		max_recv_wr:     C.uint32_t(caps.MaxRecvWR),
		max_send_sge:    C.uint32_t(caps.MaxSendSGE),
		max_recv_sge:    C.uint32_t(caps.MaxRecvSGE),
		max_inline_data: C.uint32_t(caps.MaxInline),
	}
	qp, err := C.a2a_create_qp(f, p, scq, rcq, C.int(typ), &c)
	if qp == nil {
		return nil, 0, QPCaps{}, errnoOr(err, syscall.ENOMEM)
	}
	got := QPCaps{
		MaxSendWR:  int(c.max_send_wr),
		MaxRecvWR:  int(c.max_recv_wr),
		MaxSendSGE: int(c.max_send_sge),
		MaxRecvSGE: int(c.max_recv_sge),
		MaxInline:  int(c.max_inline_data),
	}
	return qp, uint32(qp.qp_num), got, nil
}

func cDestroyQP(f *cFns, qp *cQP) error {
	rc, err := C.a2a_destroy_qp(f, qp)
	return rcErr(rc, err)
}

func cModifyQP(f *cFns, qp *cQP, m qpModify) error {
	var a C.struct_ibv_qp_attr
	mask := C.int(C.IBV_QP_STATE)
	a.qp_state = C.int(m.state)
	switch m.state {
	case qpsInit:
		a.pkey_index = C.uint16_t(m.pkeyIndex)
		a.port_num = C.uint8_t(m.port)
		a.qp_access_flags = C.uint(m.access)
		mask |= C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT | C.IBV_QP_ACCESS_FLAGS
	case qpsRTR:
		a.path_mtu = C.int(m.mtu)
		a.dest_qp_num = C.uint32_t(m.destQPN)
		a.rq_psn = C.uint32_t(m.rqPSN)
		a.max_dest_rd_atomic = C.uint8_t(m.maxDestRDAtomic)
		a.min_rnr_timer = C.uint8_t(m.minRNRTimer)
		ah := &a.ah_attr
		ah.dlid = C.uint16_t(m.dlid)
		ah.sl = C.uint8_t(m.sl)
		ah.port_num = C.uint8_t(m.port)
		if m.global {
			ah.is_global = 1
			*(*GID)(unsafe.Pointer(&ah.grh.dgid)) = m.dgid
			ah.grh.sgid_index = C.uint8_t(m.sgidIndex)
			ah.grh.hop_limit = C.uint8_t(m.hopLimit)
			ah.grh.traffic_class = C.uint8_t(m.trafficClass)
		}
		mask |= C.IBV_QP_AV | C.IBV_QP_PATH_MTU | C.IBV_QP_DEST_QPN | C.IBV_QP_RQ_PSN |
			C.IBV_QP_MAX_DEST_RD_ATOMIC | C.IBV_QP_MIN_RNR_TIMER
	case qpsRTS:
		a.sq_psn = C.uint32_t(m.sqPSN)
		a.timeout = C.uint8_t(m.timeout)
		a.retry_cnt = C.uint8_t(m.retryCount)
		a.rnr_retry = C.uint8_t(m.rnrRetry)
		a.max_rd_atomic = C.uint8_t(m.maxRDAtomic)
		mask |= C.IBV_QP_SQ_PSN | C.IBV_QP_TIMEOUT | C.IBV_QP_RETRY_CNT | C.IBV_QP_RNR_RETRY |
			C.IBV_QP_MAX_QP_RD_ATOMIC
	}
	rc, err := C.a2a_modify_qp(f, qp, &a, mask)
	return rcErr(rc, err)
}

func sgePtr(sges []SGE) *C.struct_ibv_sge {
	if len(sges) == 0 {
		return nil
	}
	return (*C.struct_ibv_sge)(unsafe.Pointer(&sges[0]))
}

func cPostSend(qp *cQP, wr SendWR, sges []SGE) error {
	rc := C.a2a_post_send(qp, C.uint64_t(wr.ID), C.int(wr.Op), C.uint(wr.Flags), C.uint32_t(htonl(wr.Imm)),
		C.uint64_t(wr.RemoteAddr), C.uint32_t(wr.RKey), sgePtr(sges), C.int(len(sges)))
	return rcErr(rc, nil)
}

func cPostRecv(qp *cQP, id uint64, sges []SGE) error {
	rc := C.a2a_post_recv(qp, C.uint64_t(id), sgePtr(sges), C.int(len(sges)))
	return rcErr(rc, nil)
}

func cPostRecvs(qp *cQP, ids []uint64, sges []SGE) error {
	if len(ids) == 0 {
		return nil
	}
	rc := C.a2a_post_recvs(qp, (*C.uint64_t)(unsafe.Pointer(&ids[0])), sgePtr(sges), C.int(len(ids)))
	return rcErr(rc, nil)
}

// cLayout lists this package's C declarations' sizes, offsets and enum values by name.
func cLayout() map[string]int64 {
	m := map[string]int64{}
	for i := 0; ; i++ {
		var name *C.char
		v := C.a2a_layout(C.int(i), &name)
		if v < 0 {
			return m
		}
		m[C.GoString(name)] = int64(v)
	}
}
