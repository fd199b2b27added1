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

// func axpbyBF16AVX2(dst, a, b *byte, n int, wa, wb float32)
TEXT ·axpbyBF16AVX2(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         a+8(FP), SI
	MOVQ         b+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS wa+32(FP), Y0
	VBROADCASTSS wb+36(FP), Y1
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
	VMOVDQU   Y5, (DI)
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

// func axpbyF32AVX2(dst, a, b *byte, n int, wa, wb float32)
TEXT ·axpbyF32AVX2(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         a+8(FP), SI
	MOVQ         b+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSS wa+32(FP), Y0
	VBROADCASTSS wb+36(FP), Y1

axpbyF32loop:
	CMPQ    CX, $8
	JLT     axpbyF32done
	VMULPS  (SI), Y0, Y2
	VMULPS  (DX), Y1, Y3
	VADDPS  Y3, Y2, Y2
	VMOVUPS Y2, (DI)
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
