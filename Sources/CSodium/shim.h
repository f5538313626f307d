#ifndef TRELLIS_CSODIUM_SHIM_H
#define TRELLIS_CSODIUM_SHIM_H
#include <sodium.h>
#endif
