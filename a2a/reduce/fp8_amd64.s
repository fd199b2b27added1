//go:build amd64 && !purego

#include "textflag.h"

// The kernels process n elements, a multiple of 8 (the Go callers finish the
// tail), and produce exactly the bits of the portable code in fp8.go.

DATA e4m3abs<>+0(SB)/4, $0x7fffffff
GLOBL e4m3abs<>(SB), RODATA|NOPTR, $4
DATA e4m3half<>+0(SB)/4, $0x0007ffff // just under half of the 20 dropped bits
GLOBL e4m3half<>(SB), RODATA|NOPTR, $4
DATA e4m3one<>+0(SB)/4, $0x00000001
GLOBL e4m3one<>(SB), RODATA|NOPTR, $4
DATA e4m3rebias<>+0(SB)/4, $960 // (127-7) << 3: exponent bias 127 -> 7
GLOBL e4m3rebias<>(SB), RODATA|NOPTR, $4
DATA e4m3max<>+0(SB)/4, $0x7e // 448
GLOBL e4m3max<>(SB), RODATA|NOPTR, $4
DATA e4m3minnorm<>+0(SB)/4, $0x3c800000 // 2^-6, the smallest normal
GLOBL e4m3minnorm<>(SB), RODATA|NOPTR, $4
DATA e4m3f512<>+0(SB)/4, $0x44000000 // 512.0: one subnormal step 2^-9 -> 1
GLOBL e4m3f512<>(SB), RODATA|NOPTR, $4
DATA e4m3magic<>+0(SB)/4, $0x4b000000 // 2^23: rounds to an integer
GLOBL e4m3magic<>(SB), RODATA|NOPTR, $4
DATA e4m3bf16half<>+0(SB)/4, $0x00007fff
GLOBL e4m3bf16half<>(SB), RODATA|NOPTR, $4
DATA e4m3mag<>+0(SB)/4, $0x7f // E4M3 magnitude bits; 0x7f alone is NaN
GLOBL e4m3mag<>(SB), RODATA|NOPTR, $4
DATA e4m3sub<>+0(SB)/4, $8 // magnitudes below 8 are subnormals
GLOBL e4m3sub<>(SB), RODATA|NOPTR, $4
DATA e4m3bias<>+0(SB)/4, $0x3c000000 // 120 << 23: exponent bias 7 -> 127
GLOBL e4m3bias<>(SB), RODATA|NOPTR, $4
DATA e4m3step<>+0(SB)/4, $0x3b000000 // 2^-9, the subnormal step
GLOBL e4m3step<>(SB), RODATA|NOPTR, $4
DATA e4m3qnan<>+0(SB)/4, $0x7fc00000 // e4m3Table's NaN, whatever the sign
GLOBL e4m3qnan<>(SB), RODATA|NOPTR, $4

// e4m3pack moves byte 0 of each dword of a 128-bit lane to bytes 0-3 (VPSHUFB
// zeroes the bytes whose index has the top bit set).
DATA e4m3pack<>+0(SB)/8, $0x808080800c080400
DATA e4m3pack<>+8(SB)/8, $0x8080808080808080
GLOBL e4m3pack<>(SB), RODATA|NOPTR, $16

// DECODE_E4M3 widens the 8 E4M3 bytes at (SI) into the float32 lanes of Y3,
// the values of e4m3Table built from the bits rather than gathered (a gather
// is microcoded and slow on AMD cores): a normal magnitude m (bits 0-6) is
// m<<20 rebiased by 120<<23, a subnormal one m * 2^-9 (exact), 0x7f the
// table's NaN; then the sign goes to bit 31. Uses Y1, Y2, Y4, Y14; Y9-Y13 hold
// 0x7f, 8, 0x3c000000, 2^-9 and the NaN in every lane.
#define DECODE_E4M3 \
	VPMOVZXBD (SI), Y1        \
	VPAND     Y9, Y1, Y2      \
	VPXOR     Y2, Y1, Y1      \
	VPSLLD    $24, Y1, Y1     \
	VPSLLD    $20, Y2, Y3     \
	VPADDD    Y11, Y3, Y3     \
	VCVTDQ2PS Y2, Y4          \
	VMULPS    Y12, Y4, Y4     \
	VPCMPGTD  Y2, Y10, Y14    \
	VPBLENDVB Y14, Y4, Y3, Y3 \
	VPOR      Y1, Y3, Y3      \
	VPCMPEQD  Y9, Y2, Y14     \
	VPBLENDVB Y14, Y13, Y3, Y3

// DECODE_CONSTS loads the constants of DECODE_E4M3.
#define DECODE_CONSTS \
	VPBROADCASTD e4m3mag<>(SB), Y9    \
	VPBROADCASTD e4m3sub<>(SB), Y10   \
	VPBROADCASTD e4m3bias<>(SB), Y11  \
	VPBROADCASTD e4m3step<>(SB), Y12  \
	VPBROADCASTD e4m3qnan<>(SB), Y13

// func amaxF32AVX2(x *float32, n int) uint32
// The largest |x[i]| as a bit pattern: for non-negative floats the unsigned
// order of the patterns is the order of the values (Inf and NaN above all).
TEXT ·amaxF32AVX2(SB), NOSPLIT, $0-20
	MOVQ         x+0(FP), SI
	MOVQ         n+8(FP), CX
	VPBROADCASTD e4m3abs<>(SB), Y1
	VPXOR        Y0, Y0, Y0

amaxloop:
	CMPQ    CX, $8
	JLT     amaxdone
	VPAND   (SI), Y1, Y2
	VPMAXUD Y2, Y0, Y0
	ADDQ    $32, SI
	SUBQ    $8, CX
	JMP     amaxloop

amaxdone:
	VEXTRACTI128 $1, Y0, X1
	VPMAXUD      X1, X0, X0
	VPSHUFD      $0x4e, X0, X1
	VPMAXUD      X1, X0, X0
	VPSHUFD      $0xb1, X0, X1
	VPMAXUD      X1, X0, X0
	VMOVD        X0, AX
	MOVL         AX, ret+16(FP)
	VZEROUPPER
	RET

// func widenBF16AVX2(dst *float32, src *uint16, n int)
// A bfloat16 is the top half of its float32.
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

widenloop:
	CMPQ      CX, $8
	JLT       widendone
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JMP       widenloop

widendone:
	VZEROUPPER
	RET

// func quantizeE4M3AVX2(dst *uint8, src *float32, n int, inv float32)
// dst[i] = F32ToE4M3(src[i]*inv) for finite products (the caller checks the
// block is finite and inv is not Inf, so no NaN arises): both branches of
// F32ToE4M3 are computed in every lane and blended on a < 2^-6.
TEXT ·quantizeE4M3AVX2(SB), NOSPLIT, $0-28
	MOVQ           dst+0(FP), DI
	MOVQ           src+8(FP), SI
	MOVQ           n+16(FP), CX
	VBROADCASTSS   inv+24(FP), Y0
	VPBROADCASTD   e4m3abs<>(SB), Y1
	VPBROADCASTD   e4m3half<>(SB), Y2
	VPBROADCASTD   e4m3one<>(SB), Y3
	VPBROADCASTD   e4m3rebias<>(SB), Y4
	VPBROADCASTD   e4m3max<>(SB), Y5
	VPBROADCASTD   e4m3minnorm<>(SB), Y6
	VPBROADCASTD   e4m3f512<>(SB), Y7
	VPBROADCASTD   e4m3magic<>(SB), Y8
	VBROADCASTI128 e4m3pack<>(SB), Y9

quantloop:
	CMPQ   CX, $8
	JLT    quantdone
	VMULPS (SI), Y0, Y10 // f = x * inv, rounded once as in Go
	VPAND  Y1, Y10, Y11  // a = |f|
	VPXOR  Y11, Y10, Y10 // the sign bit alone
	VPSRLD $24, Y10, Y10 // ... moved to bit 7

	// Normal: (a + 0x7ffff + lsb) >> 20 - 960, at most 0x7e (which also
	// saturates 448 and above; lanes below 2^-6 may wrap, and are replaced).
	VPSRLD  $20, Y11, Y12
	VPAND   Y3, Y12, Y12
	VPADDD  Y2, Y11, Y13
	VPADDD  Y12, Y13, Y13
	VPSRLD  $20, Y13, Y13
	VPSUBD  Y4, Y13, Y13
	VPMINUD Y5, Y13, Y13

	// Below 2^-6: bits(a*512 + 2^23) - bits(2^23), a*512 being exact.
	VMULPS Y7, Y11, Y14
	VADDPS Y8, Y14, Y14
	VPSUBD Y8, Y14, Y14

	VPCMPGTD  Y11, Y6, Y15      // a < 2^-6 (a is non-negative as an int32)
	VPBLENDVB Y15, Y14, Y13, Y13
	VPOR      Y10, Y13, Y13

	// Eight dwords holding one byte each -> eight bytes.
	VPSHUFB      Y9, Y13, Y13
	VEXTRACTI128 $1, Y13, X14
	VPUNPCKLDQ   X14, X13, X13
	VMOVQ        X13, (DI)
	ADDQ         $32, SI
	ADDQ         $8, DI
	SUBQ         $8, CX
	JMP          quantloop

quantdone:
	VZEROUPPER
	RET

// func dequantizeE4M3AVX2(dst *float32, src *uint8, n int, scale float32, )
// dst[i] = e4m3Table[src[i]] * scale, the table value being the first operand
// of the product as in Go (it decides which NaN comes out if both are NaN).
TEXT ·dequantizeE4M3AVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y0
	DECODE_CONSTS

dequantloop:
	CMPQ       CX, $8
	JLT        dequantdone
	DECODE_E4M3
	VMULPS     Y0, Y3, Y3
	VMOVUPS    Y3, (DI)
	ADDQ       $8, SI
	ADDQ       $32, DI
	SUBQ       $8, CX
	JMP        dequantloop

dequantdone:
	VZEROUPPER
	RET

// func dequantizeE4M3BF16AVX2(dst *uint16, src *uint8, n int, scale float32, )
// As dequantizeE4M3AVX2, then F32ToBF16: add 0x7fff plus the lowest kept
// bit and keep the top half (ties to even). NaN lanes are truncated instead:
// a product that is NaN is a quiet NaN, so its top half keeps the quiet bit,
// which is what F32ToBF16 makes of it.
TEXT ·dequantizeE4M3BF16AVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y0
	DECODE_CONSTS
	VPBROADCASTD e4m3bf16half<>(SB), Y7
	VPBROADCASTD e4m3one<>(SB), Y8

dequant16loop:
	CMPQ         CX, $8
	JLT          dequant16done
	DECODE_E4M3
	VMULPS       Y0, Y3, Y3
	VPSRLD       $16, Y3, Y4
	VPAND        Y8, Y4, Y4
	VPADDD       Y7, Y3, Y5
	VPADDD       Y4, Y5, Y5
	VCMPPS       $3, Y3, Y3, Y6       // unordered: NaN
	VPBLENDVB    Y6, Y3, Y5, Y5
	VPSRLD       $16, Y5, Y5
	VEXTRACTI128 $1, Y5, X6
	VPACKUSDW    X6, X5, X5
	VMOVDQU      X5, (DI)
	ADDQ         $8, SI
	ADDQ         $16, DI
	SUBQ         $8, CX
	JMP          dequant16loop

dequant16done:
	VZEROUPPER
	RET
