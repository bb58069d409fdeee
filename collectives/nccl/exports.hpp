// How the NCCL API layer exports its entry points: each is defined as pnccl<Name> and exported
// also as nccl<Name>, a weak alias (profilers interpose on the nccl names, as with NVIDIA's
// library). exports.map keeps every other symbol of the library local.
#pragma once

#define COCCL_NCCL_ALIAS(name) \
  extern "C" __attribute__((weak, alias("p" #name))) decltype(name) name;
