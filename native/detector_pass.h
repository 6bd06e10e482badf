// The per-step detector pass of the runtime guard: token_repeat, spec_acceptance and garbled
// over every row of one step's telemetry columns, in one native call. The guard keeps each
// request's detector state in records of int32 words (float64 at even words) inside one slab;
// this pass updates the records in place and reports hits. The algorithms and the record
// layouts are the ones documented in src/guard/detectors/*.ts; TypeScript builds the
// parameters and checks the columns, this file trusts them except for the bounds it needs to
// stay inside its buffers.
#pragma once
#include <napi.h>

namespace wavebus {

// JS: detectStep(state: Int32Array, params: Float64Array, ignore: Uint32Array,
//                rowRecord: Int32Array, rowMuted: Int32Array, tokenCount: Uint32Array,
//                tokenIds: Uint32Array, tokenLogprobs: Float32Array, tokenRanks: Uint32Array,
//                draftLen: Uint32Array, accepted: Uint32Array, hits: Float64Array): number
void RegisterDetectorPass(Napi::Env env, Napi::Object exports);

}  // namespace wavebus
