//go:build amd64 && !purego

#include "textflag.h"

// d[i] = a[i] + b[i] over the first bytes of d, a multiple of 128 (the Go
// callers finish the tail). Each iteration loads all of a's and b's
// 128 bytes before it stores, so d may be a or b itself. IEEE addition in a
// vector lane gives the bits of the scalar one, NaNs included (the first
// operand's, a's, as ADDSS does).
// func sumF32AVX2(d, a, b *float32, bytes int)
TEXT ·sumF32AVX2(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ bytes+24(FP), CX
	SHRQ $7, CX
	JZ   f32done
f32loop:
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS  0(DX), Y0, Y0
	VADDPS  32(DX), Y1, Y1
	VADDPS  64(DX), Y2, Y2
	VADDPS  96(DX), Y3, Y3
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DX
	ADDQ    $128, DI
	DECQ    CX
	JNZ     f32loop
f32done:
	VZEROUPPER
	RET

// func sumF64AVX2(d, a, b *float64, bytes int)
TEXT ·sumF64AVX2(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ bytes+24(FP), CX
	SHRQ $7, CX
	JZ   f64done
f64loop:
	VMOVUPD 0(SI), Y0
	VMOVUPD 32(SI), Y1
	VMOVUPD 64(SI), Y2
	VMOVUPD 96(SI), Y3
	VADDPD  0(DX), Y0, Y0
	VADDPD  32(DX), Y1, Y1
	VADDPD  64(DX), Y2, Y2
	VADDPD  96(DX), Y3, Y3
	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DX
	ADDQ    $128, DI
	DECQ    CX
	JNZ     f64loop
f64done:
	VZEROUPPER
	RET

// func sumI32AVX2(d, a, b *int32, bytes int)
TEXT ·sumI32AVX2(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ bytes+24(FP), CX
	SHRQ $7, CX
	JZ   i32done
i32loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPADDD  0(DX), Y0, Y0
	VPADDD  32(DX), Y1, Y1
	VPADDD  64(DX), Y2, Y2
	VPADDD  96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DX
	ADDQ    $128, DI
	DECQ    CX
	JNZ     i32loop
i32done:
	VZEROUPPER
	RET

// func sumI64AVX2(d, a, b *int64, bytes int)
TEXT ·sumI64AVX2(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ bytes+24(FP), CX
	SHRQ $7, CX
	JZ   i64done
i64loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPADDQ  0(DX), Y0, Y0
	VPADDQ  32(DX), Y1, Y1
	VPADDQ  64(DX), Y2, Y2
	VPADDQ  96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DX
	ADDQ    $128, DI
	DECQ    CX
	JNZ     i64loop
i64done:
	VZEROUPPER
	RET
