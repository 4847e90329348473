// TAILMASK splits the element count in CX: K1 masks its last n mod
// 2^bits elements, R11 holds how many those are, R10 the whole blocks of
// 2^bits; clobbers AX and CX.
#define TAILMASK(bits, mask) \
	MOVQ CX, R10 \
	ANDQ $mask, CX \
	MOVQ $1, AX \
	SHLQ CX, AX \
	DECQ AX \
	KMOVW AX, K1 \
	MOVQ CX, R11 \
	SHRQ $bits, R10
