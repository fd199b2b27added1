//go:build amd64 && !purego

#include "textflag.h"

// Rounding constants of float32 -> bfloat16: add 0x7fff plus the lowest kept
// bit, then keep the top half (ties to even). NaN lanes are truncated instead:
// arithmetic NaNs are quiet, so their top half stays a NaN.
DATA bf16half<>+0(SB)/4, $0x00007fff
GLOBL bf16half<>(SB), RODATA|NOPTR, $4
DATA bf16one<>+0(SB)/4, $0x00000001
GLOBL bf16one<>(SB), RODATA|NOPTR, $4

// ROUND_BF16 rounds the 8 float32 lanes of Y2 to bfloat16 and stores them
// (16 bytes) at (DI). Uses Y4-Y6; Y7 = 0x7fff, Y8 = 1 in every lane.
#define ROUND_BF16 \
	VPSRLD       $16, Y2, Y4     \
	VPAND        Y8, Y4, Y4      \
	VPADDD       Y7, Y2, Y5      \
	VPADDD       Y4, Y5, Y5      \
	VCMPPS       $3, Y2, Y2, Y6  \
	VPBLENDVB    Y6, Y2, Y5, Y5  \
	VPSRLD       $16, Y5, Y5     \
	VEXTRACTI128 $1, Y5, X6      \
	VPACKUSDW    X6, X5, X5      \
	VMOVDQU      X5, (DI)

// ROUND_BF16_512 rounds the 16 float32 lanes of Z2 to bfloat16, leaving them
// in the low half of each lane of Z4: as ROUND_BF16, with the NaN lanes
// (mask K1) truncated. Uses Z5; Z7 = 0x7fff, Z8 = 1 in every lane.
#define ROUND_BF16_512(Z2, Z4, K1) \
	VPSRLD    $16, Z2, Z4     \
	VPANDD    Z8, Z4, Z4      \
	VPADDD    Z7, Z4, Z4      \
	VPADDD    Z2, Z4, Z4      \
	VCMPPS    $3, Z2, Z2, K1  \
	VMOVDQA32 Z2, K1, Z4      \
	VPSRLD    $16, Z4, Z4

// func axpbyBF16AVX512(dst, a, b *byte, n int, wa, wb float32, nt bool)
// n is a multiple of 16. With nt, 64-byte blocks are stored with VMOVNTDQ:
// dst must be 64-byte aligned.
TEXT ·axpbyBF16AVX512(SB), NOSPLIT, $0-41
	MOVQ         dst+0(FP), DI
	MOVQ         a+8(FP), SI
	MOVQ         b+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS wa+32(FP), Z0
	VBROADCASTSS wb+36(FP), Z1
	MOVBQZX      nt+40(FP), R8
	VPBROADCASTD bf16half<>(SB), Z7
	VPBROADCASTD bf16one<>(SB), Z8

axpby512loop32:
	CMPQ      CX, $32
	JLT       axpby512loop16
	VPMOVZXWD (SI), Z2
	VPMOVZXWD 32(SI), Z9
	VPSLLD    $16, Z2, Z2
	VPSLLD    $16, Z9, Z9
	VPMOVZXWD (DX), Z3
	VPMOVZXWD 32(DX), Z10
	VPSLLD    $16, Z3, Z3
	VPSLLD    $16, Z10, Z10
	VMULPS    Z0, Z2, Z2
	VMULPS    Z0, Z9, Z9
	VMULPS    Z1, Z3, Z3
	VMULPS    Z1, Z10, Z10
	VADDPS    Z3, Z2, Z2
	VADDPS    Z10, Z9, Z9
	ROUND_BF16_512(Z2, Z4, K1)
	ROUND_BF16_512(Z9, Z11, K2)
	VPMOVDW   Z4, Y4
	VPMOVDW   Z11, Y11
	VINSERTI64X4 $1, Y11, Z4, Z4
	TESTQ     R8, R8
	JNZ       axpby512stream
	VMOVDQU64 Z4, (DI)
	JMP       axpby512stored

axpby512stream:
	VMOVNTDQ Z4, (DI)

axpby512stored:
	ADDQ      $64, SI
	ADDQ      $64, DX
	ADDQ      $64, DI
	SUBQ      $32, CX
	JMP       axpby512loop32

axpby512loop16:
	CMPQ      CX, $16
	JLT       axpby512done
	VPMOVZXWD (SI), Z2
	VPSLLD    $16, Z2, Z2
	VPMOVZXWD (DX), Z3
	VPSLLD    $16, Z3, Z3
	VMULPS    Z0, Z2, Z2
	VMULPS    Z1, Z3, Z3
	VADDPS    Z3, Z2, Z2
	ROUND_BF16_512(Z2, Z4, K1)
	VPMOVDW   Z4, (DI)
	ADDQ      $32, SI
	ADDQ      $32, DX
	ADDQ      $32, DI
	SUBQ      $16, CX
	JMP       axpby512loop16

axpby512done:
	VZEROUPPER
	RET

// func axpbyBF16AVX2(dst, a, b *byte, n int, wa, wb float32, nt bool)
// With nt, the main loop stores with VMOVNTDQ: dst must be 32-byte aligned.
TEXT ·axpbyBF16AVX2(SB), NOSPLIT, $0-41
	MOVQ         dst+0(FP), DI
	MOVQ         a+8(FP), SI
	MOVQ         b+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS wa+32(FP), Y0
	VBROADCASTSS wb+36(FP), Y1
	MOVBQZX      nt+40(FP), R8
	VPBROADCASTD bf16half<>(SB), Y7
	VPBROADCASTD bf16one<>(SB), Y8

axpbyBF16loop16:
	CMPQ      CX, $16
	JLT       axpbyBF16loop
	VPMOVZXWD (SI), Y2
	VPMOVZXWD 16(SI), Y9
	VPSLLD    $16, Y2, Y2
	VPSLLD    $16, Y9, Y9
	VPMOVZXWD (DX), Y3
	VPMOVZXWD 16(DX), Y10
	VPSLLD    $16, Y3, Y3
	VPSLLD    $16, Y10, Y10
	VMULPS    Y0, Y2, Y2
	VMULPS    Y0, Y9, Y9
	VMULPS    Y1, Y3, Y3
	VMULPS    Y1, Y10, Y10
	VADDPS    Y3, Y2, Y2
	VADDPS    Y10, Y9, Y9
	VPSRLD    $16, Y2, Y4
	VPSRLD    $16, Y9, Y11
	VPAND     Y8, Y4, Y4
	VPAND     Y8, Y11, Y11
	VPADDD    Y7, Y2, Y5
	VPADDD    Y7, Y9, Y12
	VPADDD    Y4, Y5, Y5
	VPADDD    Y11, Y12, Y12
	VCMPPS    $3, Y2, Y2, Y6
	VCMPPS    $3, Y9, Y9, Y13
	VPBLENDVB Y6, Y2, Y5, Y5
	VPBLENDVB Y13, Y9, Y12, Y12
	VPSRLD    $16, Y5, Y5
	VPSRLD    $16, Y12, Y12
	VPACKUSDW Y12, Y5, Y5
	VPERMQ    $0xd8, Y5, Y5
	TESTQ     R8, R8
	JNZ       axpbyBF16stream
	VMOVDQU   Y5, (DI)
	JMP       axpbyBF16stored

axpbyBF16stream:
	VMOVNTDQ Y5, (DI)

axpbyBF16stored:
	ADDQ      $32, SI
	ADDQ      $32, DX
	ADDQ      $32, DI
	SUBQ      $16, CX
	JMP       axpbyBF16loop16

axpbyBF16loop:
	CMPQ      CX, $8
	JLT       axpbyBF16done
	VPMOVZXWD (SI), Y2
	VPSLLD    $16, Y2, Y2
	VPMOVZXWD (DX), Y3
	VPSLLD    $16, Y3, Y3
	VMULPS    Y0, Y2, Y2
	VMULPS    Y1, Y3, Y3
	VADDPS    Y3, Y2, Y2
	ROUND_BF16
	ADDQ      $16, SI
	ADDQ      $16, DX
	ADDQ      $16, DI
	SUBQ      $8, CX
	JMP       axpbyBF16loop

axpbyBF16done:
	VZEROUPPER
	RET

// func scaleBF16AVX2(dst, a *byte, n int, w float32)
TEXT ·scaleBF16AVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         a+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS w+24(FP), Y0
	VPBROADCASTD bf16half<>(SB), Y7
	VPBROADCASTD bf16one<>(SB), Y8

scaleBF16loop:
	CMPQ      CX, $8
	JLT       scaleBF16done
	VPMOVZXWD (SI), Y2
	VPSLLD    $16, Y2, Y2
	VMULPS    Y0, Y2, Y2
	ROUND_BF16
	ADDQ      $16, SI
	ADDQ      $16, DI
	SUBQ      $8, CX
	JMP       scaleBF16loop

scaleBF16done:
	VZEROUPPER
	RET

// func axpbyF32AVX2(dst, a, b *byte, n int, wa, wb float32, nt bool)
// With nt, stores are VMOVNTPS: dst must be 32-byte aligned.
TEXT ·axpbyF32AVX2(SB), NOSPLIT, $0-41
	MOVQ         dst+0(FP), DI
	MOVQ         a+8(FP), SI
	MOVQ         b+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS wa+32(FP), Y0
	VBROADCASTSS wb+36(FP), Y1
	MOVBQZX      nt+40(FP), R8

axpbyF32loop:
	CMPQ    CX, $8
	JLT     axpbyF32done
	VMULPS  (SI), Y0, Y2
	VMULPS  (DX), Y1, Y3
	VADDPS  Y3, Y2, Y2
	TESTQ   R8, R8
	JNZ     axpbyF32stream
	VMOVUPS Y2, (DI)
	JMP     axpbyF32stored

axpbyF32stream:
	VMOVNTPS Y2, (DI)

axpbyF32stored:
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     axpbyF32loop

axpbyF32done:
	VZEROUPPER
	RET

// func scaleF32AVX2(dst, a *byte, n int, w float32)
TEXT ·scaleF32AVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         a+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS w+24(FP), Y0

scaleF32loop:
	CMPQ    CX, $8
	JLT     scaleF32done
	VMULPS  (SI), Y0, Y2
	VMOVUPS Y2, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     scaleF32loop

scaleF32done:
	VZEROUPPER
	RET

// func copyNTAVX2(dst, src *byte, n int)
// Copies n bytes, a multiple of 32, with non-temporal (streaming) stores;
// dst is 32-byte aligned. The caller orders the stores with storeFence.
TEXT ·copyNTAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

copyNTloop128:
	CMPQ     CX, $128
	JLT      copyNTloop32
	VMOVDQU  (SI), Y0
	VMOVDQU  32(SI), Y1
	VMOVDQU  64(SI), Y2
	VMOVDQU  96(SI), Y3
	VMOVNTDQ Y0, (DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ     $128, SI
	ADDQ     $128, DI
	SUBQ     $128, CX
	JMP      copyNTloop128

copyNTloop32:
	CMPQ     CX, $32
	JLT      copyNTdone
	VMOVDQU  (SI), Y0
	VMOVNTDQ Y0, (DI)
	ADDQ     $32, SI
	ADDQ     $32, DI
	SUBQ     $32, CX
	JMP      copyNTloop32

copyNTdone:
	VZEROUPPER
	RET

// func storeFence()
TEXT ·storeFence(SB), NOSPLIT, $0-0
	SFENCE
	RET

// func prefetchT0(p *byte, n int)
// Prefetches the cache lines of n > 0 bytes from p into every cache level.
TEXT ·prefetchT0(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX

prefetchLoop:
	PREFETCHT0 (SI)
	ADDQ       $64, SI
	SUBQ       $64, CX
	JGT        prefetchLoop
	RET

// func accBF16AVX2(acc *float32, a *byte, n int, w float32, first bool)
// acc = w*a (first) or acc += w*a, for n bfloat16 elements of a, n a
// multiple of 8: float32 product and sum, no fused multiply-add.
TEXT ·accBF16AVX2(SB), NOSPLIT, $0-29
	MOVQ         acc+0(FP), DI
	MOVQ         a+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS w+24(FP), Y0
	MOVBQZX      first+28(FP), R8

accBF16loop:
	CMPQ      CX, $8
	JLT       accBF16done
	VPMOVZXWD (SI), Y2
	VPSLLD    $16, Y2, Y2
	VMULPS    Y0, Y2, Y2
	TESTQ     R8, R8
	JNZ       accBF16store
	VADDPS    (DI), Y2, Y2

accBF16store:
	VMOVUPS Y2, (DI)
	ADDQ    $16, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     accBF16loop

accBF16done:
	VZEROUPPER
	RET

// func accF32AVX2(acc *float32, a *byte, n int, w float32, first bool)
// accBF16AVX2 for float32 elements.
TEXT ·accF32AVX2(SB), NOSPLIT, $0-29
	MOVQ         acc+0(FP), DI
	MOVQ         a+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS w+24(FP), Y0
	MOVBQZX      first+28(FP), R8

accF32loop:
	CMPQ    CX, $8
	JLT     accF32done
	VMULPS  (SI), Y0, Y2
	TESTQ   R8, R8
	JNZ     accF32store
	VADDPS  (DI), Y2, Y2

accF32store:
	VMOVUPS Y2, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     accF32loop

accF32done:
	VZEROUPPER
	RET

// func narrowBF16AVX2(dst *byte, acc *float32, n int)
// Rounds n float32 elements of acc, a multiple of 8, to bfloat16 at dst.
TEXT ·narrowBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ         dst+0(FP), DI
	MOVQ         acc+8(FP), SI
	MOVQ         n+16(FP), CX
	VPBROADCASTD bf16half<>(SB), Y7
	VPBROADCASTD bf16one<>(SB), Y8

narrowBF16loop:
	CMPQ    CX, $8
	JLT     narrowBF16done
	VMOVUPS (SI), Y2
	ROUND_BF16
	ADDQ    $32, SI
	ADDQ    $16, DI
	SUBQ    $8, CX
	JMP     narrowBF16loop

narrowBF16done:
	VZEROUPPER
	RET
