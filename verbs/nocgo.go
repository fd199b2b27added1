//go:build !cgo

package verbs

import (
	"syscall"
	"unsafe"
)

// Without cgo LoadLibrary fails with ErrUnavailable, so no object exists and none of the
// functions below is reached; they keep the package's API the same in both builds.

const haveCgo = false

type (
	cFns     struct{}
	cContext struct{}
	cPD      struct{}
	cMR      struct{}
	cChannel struct{}
	cCQ      struct{}
	cQP      struct{}
	cDevice  struct{}
)

var errNoCgo = syscall.ENOSYS

func cLoad(string) (*cFns, string) { return nil, "built without cgo" }
func cDevices(*cFns) (unsafe.Pointer, []*cDevice, []string, error) {
	return nil, nil, nil, errNoCgo
}
func cFreeDevices(*cFns, unsafe.Pointer)                          {}
func cOpenDevice(*cFns, *cDevice) (*cContext, error)              { return nil, errNoCgo }
func cCloseDevice(*cFns, *cContext) error                         { return errNoCgo }
func cQueryDevice(*cFns, *cContext) (deviceAttr, error)           { return deviceAttr{}, errNoCgo }
func cQueryPort(*cFns, *cContext, int) (portAttr, error)          { return portAttr{}, errNoCgo }
func cQueryGID(*cFns, *cContext, int, int) (GID, error)           { return GID{}, errNoCgo }
func cAllocPD(*cFns, *cContext) (*cPD, error)                     { return nil, errNoCgo }
func cDeallocPD(*cFns, *cPD) error                                { return errNoCgo }
func cDeregMR(*cFns, *cMR) error                                  { return errNoCgo }
func cDestroyCompChannel(*cFns, *cChannel) error                  { return errNoCgo }
func cDestroyCQ(*cFns, *cCQ) error                                { return errNoCgo }
func cGetCQEvent(*cFns, *cChannel) (*cCQ, error)                  { return nil, errNoCgo }
func cReqNotifyCQ(*cCQ, bool) error                               { return errNoCgo }
func cPollCQ(*cCQ, []WC) (int, error)                             { return 0, errNoCgo }
func cDestroyQP(*cFns, *cQP) error                                { return errNoCgo }
func cModifyQP(*cFns, *cQP, qpModify) error                       { return errNoCgo }
func cPostSend(*cQP, SendWR, []SGE) error                         { return errNoCgo }
func cPostRecv(*cQP, uint64, []SGE) error                         { return errNoCgo }
func cPostRecvs(*cQP, []uint64, []SGE) error                      { return errNoCgo }
func cLayout() map[string]int64                                   { return nil }
func cCreateCompChannel(*cFns, *cContext) (*cChannel, int, error) { return nil, -1, errNoCgo }
func cCreateCQ(*cFns, *cContext, int, *cChannel) (*cCQ, int, error) {
	return nil, 0, errNoCgo
}
func cGIDTable(*cFns, *cContext, int) ([]gidTableEntry, bool, error) { return nil, false, nil }
func cRegMR(*cFns, *cPD, uintptr, int, Access) (*cMR, uint32, uint32, error) {
	return nil, 0, 0, errNoCgo
}
func cCreateQP(*cFns, *cPD, *cCQ, *cCQ, int, QPCaps) (*cQP, uint32, QPCaps, error) {
	return nil, 0, QPCaps{}, errNoCgo
}
