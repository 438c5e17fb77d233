// Emulator shim: see cuda_emu.h
#include "cuda_emu.h"
