//go:build !amd64 || purego

package reduce

// useAVX2 is false off amd64 (or with purego): the portable loops of fp8.go
// do all the work, and the stubs below do none of it.
const useAVX2 = false

func amaxVec([]float32) (amax uint32, done int)               { return 0, 0 }
func widenVec([]float32, []uint16) (done int)                 { return 0 }
func quantizeVec([]uint8, []float32, float32) (done int)      { return 0 }
func dequantizeVec([]float32, []uint8, float32) (done int)    { return 0 }
func dequantizeBF16Vec([]uint16, []uint8, float32) (done int) { return 0 }
