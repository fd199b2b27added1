package reduce_test

import (
	"errors"
	"fmt"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// An average over three ranks' contributions: accumulate with Avg, then
// Finish once with the number of contributions.
func Example() {
	acc := []float32{1, 2, 3}
	for _, contribution := range [][]float32{{4, 5, 6}, {7, 8, 9}} {
		if err := reduce.Reduce(reduce.Float32, reduce.Avg, reduce.AsBytes(acc), reduce.AsBytes(contribution)); err != nil {
			panic(err)
		}
	}
	if err := reduce.Finish(reduce.Float32, reduce.Avg, reduce.AsBytes(acc), 3); err != nil {
		panic(err)
	}
	fmt.Println(acc)
	// Output: [4 5 6]
}

// Integer Avg truncates toward zero.
func ExampleFinish() {
	sum := []int32{-7, 7}
	if err := reduce.Finish(reduce.DTypeOf[int32](), reduce.Avg, reduce.AsBytes(sum), 2); err != nil {
		panic(err)
	}
	fmt.Println(sum)
	// Output: [-3 3]
}

// Half-precision buffers are raw bytes; the conversions round to nearest-even.
func ExampleF32ToF16() {
	fmt.Printf("%#04x %#04x %v\n", reduce.F32ToF16(1), reduce.F32ToF16(65520), reduce.F16ToF32(0x3555))
	// Output: 0x3c00 0x7c00 0.33325195
}

// A buffer that arrived as bytes (a collective's receive buffer, a
// dispatch.Handle's rows) read and written as floats in place.
func ExampleFloat32s() {
	recv := reduce.AsBytes([]float32{1, 2}) // stands for received bytes
	xs, err := reduce.Float32s(recv)
	if err != nil {
		panic(err) // misaligned, or not whole float32s: a2a.ErrInvalidArgument
	}
	xs[1] *= 10 // 20 is 0x41a00000
	_, err = reduce.Float32s(recv[1:5])
	fmt.Println(xs, recv[4:], errors.Is(err, reduce.ErrInvalidArgument))
	// Output: [1 20] [0 0 160 65] true
}
