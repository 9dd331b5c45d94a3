"""What the quantizer's generated code must hold, shared by the codegen tests."""

# A 1x16 4/6 kernel's explicit FMAs: the error estimates (two per element and candidate), their bounds (three per
# candidate), and the scales (div6's two, the Newton inverse scales' four per candidate) in the chunk loop and
# again in the decode-tie check after it
_SCALES_FMAS = 2 + 4 * 2
FOUR_SIX_FMAS = 2 * 16 * 2 + 3 * 2 + 2 * _SCALES_FMAS
