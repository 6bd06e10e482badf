#include "detector_pass.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "coded_error.h"

namespace wavebus {
namespace {

// The record layout, defined here once and exported as native.detectorLayout (the guard's
// detectors/kernel.ts and *.ts read their slots and offsets from it, as mailbox.ts reads
// native.mailboxLayout). Offsets are int32 words from the start of a detector's header; a float64
// sits at an even word and takes two.

// params (Float64Array) slots; kParamNames gives each slot the name TypeScript uses.
enum Param {
  kRecordWords,
  kRepeatOn, kRepeatHead, kRepeatBody, kRepeatWindow, kTableMask, kHashShift, kTableAt,
  kRepeatMinTokens, kRepeatThreshold, kRepeatConsecutive,
  kSpecOn, kSpecHead, kSpecBody, kSpecWindow, kLowRate, kLowLen, kHighRate, kHighLen,
  kGarbledOn, kGarbledHead, kGarbledBody, kGarbledWindow, kGarbledMinTokens,
  kSurpriseLogprob, kSurpriseRank, kSurpriseFraction, kLimitMbits,
  kParamCount
};
constexpr const char* kParamNames[] = {
  "recordWords",
  "repeatOn", "repeatHead", "repeatBody", "repeatWindow", "tableMask", "hashShift", "tableAt",
  "repeatMinTokens", "repeatThreshold", "repeatConsecutive",
  "specOn", "specHead", "specBody", "specWindow", "lowRate", "lowLen", "highRate", "highLen",
  "garbledOn", "garbledHead", "garbledBody", "garbledWindow", "garbledMinTokens",
  "surpriseLogprob", "surpriseRank", "surpriseFraction", "limitMbits",
};
static_assert(sizeof(kParamNames) / sizeof(kParamNames[0]) == kParamCount, "one name per parameter slot");

// hits (Float64Array): kHitWords per hit: row, type, then the type's figures
constexpr int kHitWords = 8;
constexpr double kTokenRepeat = 0, kSpec = 1, kGarbled = 2;
constexpr const char* kHitTypes[] = {"token_repeat", "spec_acceptance", "garbled"};
// figures each hit type writes after row and type (Repeat/Spec/Garbled::Step's out[])
constexpr int kHitFigures[] = {4, 5, 3};

// muted bits of a request (a detector the quota stopped for it); logits_finite and rank_divergence
// run in TypeScript
constexpr int32_t kMuteRepeat = 1, kMuteLogitsFinite = 2, kMuteSpec = 4, kMuteGarbled = 8, kMuteRankDivergence = 16;

// One header word: its name, offset, and whether it holds a float64 (two words, even offset).
struct Word {
  const char* name;
  int offset;
  bool f64;
};

// token_repeat header; body: ring of (token, score) pairs | table of (key, count) pairs
constexpr int kTokPos = 0, kTokLen = 1, kScorePos = 2, kSeen = 3, kConsec = 4, kLastScore = 5, kAlerted = 6, kSum = 8;
constexpr int kRepeatHeaderWords = 10;
constexpr Word kRepeatWords[] = {{"tokPos", kTokPos, false}, {"tokLen", kTokLen, false}, {"scorePos", kScorePos, false},
                                 {"seen", kSeen, false}, {"consecutive", kConsec, false}, {"lastScore", kLastScore, false},
                                 {"alerted", kAlerted, false}, {"sum", kSum, true}};
// spec_acceptance header; body: ring of (draft, accepted) float64 pairs
constexpr int kSpecPos = 0, kSpecLen = 1, kSumDraft = 2, kSumAcc = 4;
constexpr int kSpecHeaderWords = 6;
constexpr Word kSpecWords[] = {{"pos", kSpecPos, false}, {"len", kSpecLen, false}, {"sumDraft", kSumDraft, true}, {"sumAcc", kSumAcc, true}};
// garbled header; body: ring of (millibits << 1 | surprising), one word each
constexpr int kGPos = 0, kGLen = 1, kGSurprising = 2, kGSeen = 3, kGSum = 4;
constexpr int kGarbledHeaderWords = 6;
constexpr Word kGarbledWords[] = {{"pos", kGPos, false}, {"len", kGLen, false}, {"surprising", kGSurprising, false},
                                  {"seen", kGSeen, false}, {"sum", kGSum, true}};

struct Header {
  const char* detector;
  const Word* words;
  size_t count;
  int headerWords;
};
constexpr Header kHeaders[] = {
  {"tokenRepeat", kRepeatWords, sizeof(kRepeatWords) / sizeof(Word), kRepeatHeaderWords},
  {"specAcceptance", kSpecWords, sizeof(kSpecWords) / sizeof(Word), kSpecHeaderWords},
  {"garbled", kGarbledWords, sizeof(kGarbledWords) / sizeof(Word), kGarbledHeaderWords},
};

// Empty when every offset lies inside its header (a float64 at an even word, both words inside,
// the header even so the body after it stays float64-aligned) and every hit fits kHitWords;
// else what is wrong. Checked when the addon loads.
std::string LayoutProblem() {
  for (const Header& h : kHeaders) {
    if (h.headerWords <= 0 || (h.headerWords & 1) != 0) return std::string(h.detector) + ": header words must be positive and even";
    for (size_t i = 0; i < h.count; i++) {
      const Word& w = h.words[i];
      const int end = w.offset + (w.f64 ? 2 : 1);
      if (w.offset < 0 || end > h.headerWords) {
        return std::string(h.detector) + "." + w.name + " at word " + std::to_string(w.offset) + " lies outside its " + std::to_string(h.headerWords) + "-word header";
      }
      if (w.f64 && (w.offset & 1) != 0) return std::string(h.detector) + "." + w.name + " is a float64 at an odd word";
      for (size_t j = 0; j < i; j++) {
        const Word& o = h.words[j];
        if (w.offset < o.offset + (o.f64 ? 2 : 1) && o.offset < end) return std::string(h.detector) + "." + w.name + " overlaps " + o.name;
      }
    }
  }
  for (int f : kHitFigures) {
    if (2 + f > kHitWords) return "a hit's figures do not fit kHitWords";
  }
  return std::string();
}

constexpr double kMbitsPerNat = 1000.0 / 0.6931471805599453;  // 1000 / ln 2
constexpr double kMaxMbits = 1000000000.0;

template <typename T>
struct Span {
  T* data = nullptr;
  size_t length = 0;
  T& operator[](size_t i) const { return data[i]; }
};

template <typename T>
Span<T> ArgArray(const Napi::CallbackInfo& info, size_t i, napi_typedarray_type type, const char* name) {
  if (info.Length() <= i || !info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != type) {
    ThrowCoded(info.Env(), "ERR_INVALID_ARG", std::string(name) + " has the wrong typed-array type");
  }
  Napi::TypedArray a = info[i].As<Napi::TypedArray>();
  uint8_t* base = static_cast<uint8_t*>(a.ArrayBuffer().Data()) + a.ByteOffset();
  return Span<T>{reinterpret_cast<T*>(base), a.ElementLength()};
}

// A record's float64 at even word w of the state.
inline double& F64(int32_t* m, int64_t w) { return *reinterpret_cast<double*>(m + w); }

inline uint32_t Home(int32_t t, int shift) { return (static_cast<uint32_t>(t) * 0x9e3779b1u) >> shift; }

struct Repeat {
  int64_t head, body, window, tableAt;
  uint32_t mask;
  int shift;
  double minTokens, threshold, consecutive;
  Span<uint32_t> ignore;

  bool Ignored(uint32_t raw) const {
    return ignore.length > 0 && std::binary_search(ignore.data, ignore.data + ignore.length, raw);
  }

  // Count of t in the window before this token, then one more (token-repeat.ts countAndAdd).
  int32_t CountAndAdd(int32_t* m, int64_t r, int32_t t) const {
    int32_t* table = m + r + tableAt;
    uint32_t i = Home(t, shift);
    for (;;) {
      int32_t* e = table + 2 * i;
      int32_t c = e[1];
      if (c == 0) {
        e[0] = t;
        e[1] = 1;
        return 0;
      }
      if (e[0] == t) {
        e[1] = c + 1;
        return c;
      }
      i = (i + 1) & mask;
    }
  }

  // One occurrence of t leaves the window; an emptied entry is back-shift deleted.
  void Remove(int32_t* m, int64_t r, int32_t t) const {
    int32_t* table = m + r + tableAt;
    uint32_t i = Home(t, shift);
    for (;;) {
      if (table[2 * i + 1] == 0) return;  // absent: cannot happen while the ring and table agree
      if (table[2 * i] == t) break;
      i = (i + 1) & mask;
    }
    if (--table[2 * i + 1] != 0) return;
    uint32_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      int32_t cj = table[2 * j + 1];
      if (cj == 0) return;
      int32_t kj = table[2 * j];
      uint32_t h = Home(kj, shift);
      bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        table[2 * i] = kj;
        table[2 * i + 1] = cj;
        table[2 * j + 1] = 0;
        i = j;
      }
    }
  }

  // Returns true on the alert, with its figures in out[0..3]. As upstream (vllm-ascend
  // runtime_guard token_repeat check_one): every token of the step is an evaluation step, an
  // ignored one included (it scores 0 and can extend or break a run of over-steps); a step that
  // reached consecutive_hits is still folded in to its end, and the alert carries the state at
  // the end of the step (repeat_sum, content tokens, the last token's score, the run length).
  bool Step(int32_t* m, int64_t rec, const uint32_t* tokens, size_t n, double* out) const {
    const int64_t b = rec + head;
    const int64_t r = rec + body;
    if (m[b + kAlerted] != 0) return false;
    double& sumRef = F64(m, b + kSum);
    bool hit = false;
    int32_t score = 0;
    for (size_t k = 0; k < n; k++) {
      score = 0;
      const uint32_t raw = tokens[k];
      if (!Ignored(raw)) {
        const int32_t t = static_cast<int32_t>(raw);
        score = CountAndAdd(m, r, t);
        const int32_t pos = m[b + kTokPos];
        const int64_t at = r + 2 * static_cast<int64_t>(pos);
        if (m[b + kTokLen] == window) Remove(m, r, m[at]);
        else m[b + kTokLen]++;
        m[at] = t;
        m[b + kTokPos] = pos + 1 == window ? 0 : pos + 1;
        ++m[b + kSeen];
      }
      const int32_t sp = m[b + kScorePos];
      const int64_t sat = r + 2 * static_cast<int64_t>(sp) + 1;
      const double sum = sumRef + score - m[sat];
      sumRef = sum;
      m[sat] = score;
      m[b + kScorePos] = sp + 1 == window ? 0 : sp + 1;
      if (m[b + kSeen] >= minTokens && sum > threshold) {
        if (++m[b + kConsec] >= consecutive) hit = true;
      } else {
        m[b + kConsec] = 0;
      }
    }
    if (n > 0) m[b + kLastScore] = score;
    if (!hit) return false;
    m[b + kAlerted] = 1;
    out[0] = sumRef;
    out[1] = m[b + kSeen];
    out[2] = score;
    out[3] = m[b + kConsec];
    return true;
  }
};

struct Spec {
  int64_t head, body, window;
  double lowRate, lowLen, highRate, highLen;

  // Returns true on a hit, with direction (0 low, 1 high), rate, mean length, sums in out[0..4].
  bool Step(int32_t* m, int64_t rec, uint32_t draftLen, uint32_t accepted, double* out) const {
    const int64_t b = rec + head;
    const int64_t r = rec + body;
    // The seed's accepted_draft = max(0, accepted - 1), uncapped (upstream does not cap it either).
    const double a = std::max<double>(0, static_cast<double>(accepted) - 1);
    const int32_t pos = m[b + kSpecPos];
    const int32_t len = m[b + kSpecLen];
    double* slot = &F64(m, r + 4 * static_cast<int64_t>(pos));
    double sumDraft = F64(m, b + kSumDraft);
    double sumAcc = F64(m, b + kSumAcc);
    if (len == window) {
      sumDraft -= slot[0];
      sumAcc -= slot[1];
    } else {
      m[b + kSpecLen] = len + 1;
    }
    slot[0] = draftLen;
    slot[1] = a;
    sumDraft += draftLen;
    sumAcc += a;
    F64(m, b + kSumDraft) = sumDraft;
    F64(m, b + kSumAcc) = sumAcc;
    m[b + kSpecPos] = pos + 1 == window ? 0 : pos + 1;
    if (len + 1 < window) return false;
    const double rate = sumAcc / sumDraft;
    const double meanLen = sumAcc / static_cast<double>(window);
    double direction;
    if (rate < lowRate && meanLen < lowLen) direction = 0;
    else if (rate > highRate && meanLen > highLen) direction = 1;
    else return false;
    // The window slides on after an alert: as upstream, every full-window step where the condition
    // holds is an alert; the report quotas (max_per_req, backoff) decide which are reported.
    out[0] = direction;
    out[1] = rate;
    out[2] = meanLen;
    out[3] = sumDraft;
    out[4] = sumAcc;
    return true;
  }
};

struct Garbled {
  int64_t head, body, window;
  double minTokens, surpriseLogprob, surpriseRank, surpriseFraction, limitMbits;

  // Returns true on a hit, with fraction, mean surprisal bits, tokens seen in out[0..2].
  bool Step(int32_t* m, int64_t rec, const float* logprobs, const uint32_t* ranks, size_t n, double* out) const {
    const int64_t b = rec + head;
    int32_t* ring = m + rec + body;
    double& sumRef = F64(m, b + kGSum);
    for (size_t k = 0; k < n; k++) {
      const double lp = logprobs[k];
      if (std::isnan(lp)) continue;
      // Math.round of a positive number: floor(x + 0.5); -Infinity clamps to the maximum
      const double mbD = lp >= 0 ? 0 : std::min(kMaxMbits, std::floor(-lp * kMbitsPerNat + 0.5));
      const int32_t mb = static_cast<int32_t>(mbD);
      const int32_t sur = lp < surpriseLogprob || (ranks != nullptr && ranks[k] >= surpriseRank) ? 1 : 0;
      const int32_t pos = m[b + kGPos];
      const int32_t len = m[b + kGLen];
      double sum = sumRef;
      int32_t nSur = m[b + kGSurprising];
      if (len == window) {
        const uint32_t old = static_cast<uint32_t>(ring[pos]);
        sum -= old >> 1;
        nSur -= old & 1;
      } else {
        m[b + kGLen] = len + 1;
      }
      ring[pos] = static_cast<int32_t>((static_cast<uint32_t>(mb) << 1) | static_cast<uint32_t>(sur));
      sum += mb;
      nSur += sur;
      sumRef = sum;
      m[b + kGSurprising] = nSur;
      m[b + kGPos] = pos + 1 == window ? 0 : pos + 1;
      const int32_t seen = ++m[b + kGSeen];
      if (len + 1 < window || seen < minTokens) continue;
      const double fraction = static_cast<double>(nSur) / static_cast<double>(window);
      if (fraction > surpriseFraction && sum > limitMbits * static_cast<double>(window)) {
        m[b + kGPos] = 0;
        m[b + kGLen] = 0;
        m[b + kGSurprising] = 0;
        sumRef = 0;
        out[0] = fraction;
        out[1] = sum / static_cast<double>(window) / 1000.0;
        out[2] = seen;
        return true;
      }
    }
    return false;
  }
};

Napi::Value JsDetectStep(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto state = ArgArray<int32_t>(info, 0, napi_int32_array, "state");
  auto params = ArgArray<double>(info, 1, napi_float64_array, "params");
  auto ignore = ArgArray<uint32_t>(info, 2, napi_uint32_array, "ignore");
  auto rowRecord = ArgArray<int32_t>(info, 3, napi_int32_array, "rowRecord");
  auto rowMuted = ArgArray<int32_t>(info, 4, napi_int32_array, "rowMuted");
  auto tokenCount = ArgArray<uint32_t>(info, 5, napi_uint32_array, "tokenCount");
  auto tokenIds = ArgArray<uint32_t>(info, 6, napi_uint32_array, "tokenIds");
  auto logprobs = ArgArray<float>(info, 7, napi_float32_array, "tokenLogprobs");
  auto ranks = ArgArray<uint32_t>(info, 8, napi_uint32_array, "tokenRanks");
  auto draftLen = ArgArray<uint32_t>(info, 9, napi_uint32_array, "draftLen");
  auto accepted = ArgArray<uint32_t>(info, 10, napi_uint32_array, "accepted");
  auto hits = ArgArray<double>(info, 11, napi_float64_array, "hits");

  // Only the bounds this pass needs to stay inside its buffers; the policy checks are TypeScript's.
  const size_t rows = rowRecord.length;
  const size_t tokens = tokenIds.length;
  if (params.length < kParamCount) ThrowCoded(env, "ERR_INVALID_ARG", "params is too short");
  if (state.data == nullptr || (reinterpret_cast<uintptr_t>(state.data) & 7) != 0) ThrowCoded(env, "ERR_INVALID_ARG", "state must be 8-byte aligned");
  if (rowMuted.length != rows) ThrowCoded(env, "ERR_INVALID_ARG", "rowMuted must have one entry per row");
  if (tokenCount.length != 0 && tokenCount.length != rows) ThrowCoded(env, "ERR_INVALID_ARG", "tokenCount must be empty or have one entry per row");
  if (logprobs.length != 0 && logprobs.length != tokens) ThrowCoded(env, "ERR_INVALID_ARG", "tokenLogprobs must be empty or match tokenIds");
  if (ranks.length != 0 && ranks.length != tokens) ThrowCoded(env, "ERR_INVALID_ARG", "tokenRanks must be empty or match tokenIds");
  if (draftLen.length != 0 && draftLen.length != rows) ThrowCoded(env, "ERR_INVALID_ARG", "draftLen must be empty or have one entry per row");
  if (accepted.length != draftLen.length) ThrowCoded(env, "ERR_INVALID_ARG", "accepted must match draftLen");
  if (hits.length < rows * 3 * kHitWords) ThrowCoded(env, "ERR_INVALID_ARG", "hits has room for fewer than three hits per row");
  const int64_t recordWords = static_cast<int64_t>(params[kRecordWords]);
  if (recordWords <= 0 || (recordWords & 1) != 0) ThrowCoded(env, "ERR_INVALID_ARG", "params: record words must be positive and even");

  const bool repeatOn = params[kRepeatOn] != 0, specOn = params[kSpecOn] != 0, garbledOn = params[kGarbledOn] != 0;
  Repeat rep{static_cast<int64_t>(params[kRepeatHead]), static_cast<int64_t>(params[kRepeatBody]), static_cast<int64_t>(params[kRepeatWindow]),
             static_cast<int64_t>(params[kTableAt]), static_cast<uint32_t>(params[kTableMask]), static_cast<int>(params[kHashShift]),
             params[kRepeatMinTokens], params[kRepeatThreshold], params[kRepeatConsecutive], ignore};
  Spec spec{static_cast<int64_t>(params[kSpecHead]), static_cast<int64_t>(params[kSpecBody]), static_cast<int64_t>(params[kSpecWindow]),
            params[kLowRate], params[kLowLen], params[kHighRate], params[kHighLen]};
  Garbled gar{static_cast<int64_t>(params[kGarbledHead]), static_cast<int64_t>(params[kGarbledBody]), static_cast<int64_t>(params[kGarbledWindow]),
              params[kGarbledMinTokens], params[kSurpriseLogprob], params[kSurpriseRank], params[kSurpriseFraction], params[kLimitMbits]};
  if ((repeatOn && rep.window <= 0) || (specOn && spec.window <= 0) || (garbledOn && gar.window <= 0)) ThrowCoded(env, "ERR_INVALID_ARG", "params: a window must be positive");
  // Every part a pass touches lies inside the record: the header (float64s need it even) and the
  // body the window implies. Checked once per call, so no row can reach past its record.
  auto inside = [&](const char* what, int64_t at, int64_t words, bool even) {
    if (at < 0 || words < 0 || at + words > recordWords || (even && (at & 1) != 0)) {
      ThrowCoded(env, "ERR_INVALID_ARG", std::string("params: ") + what + " at word " + std::to_string(at) + " (" + std::to_string(words) +
                                            " words) is outside the " + std::to_string(recordWords) + "-word record");
    }
  };
  if (repeatOn) {
    // The hash lands in [0, 2^(32-shift)): that must be the table exactly, or a probe leaves it.
    const uint64_t slots = static_cast<uint64_t>(rep.mask) + 1;
    if (rep.tableAt < 2 * rep.window || slots < static_cast<uint64_t>(rep.window) + 1 || (slots & rep.mask) != 0 || rep.shift < 1 ||
        rep.shift > 31 || (0xffffffffu >> rep.shift) != rep.mask) {
      ThrowCoded(env, "ERR_INVALID_ARG", "params: token_repeat table must follow the ring, hold window+1 keys in a power-of-two size and match the hash shift");
    }
    inside("token_repeat header", rep.head, kRepeatHeaderWords, true);
    inside("token_repeat body", rep.body, rep.tableAt + 2 * (static_cast<int64_t>(rep.mask) + 1), false);
  }
  if (specOn) {
    inside("spec_acceptance header", spec.head, kSpecHeaderWords, true);
    inside("spec_acceptance body", spec.body, 4 * spec.window, true);
  }
  if (garbledOn) {
    inside("garbled header", gar.head, kGarbledHeaderWords, true);
    inside("garbled body", gar.body, gar.window, false);
  }

  int32_t* m = state.data;
  const int64_t stateWords = static_cast<int64_t>(state.length);
  size_t nHits = 0;
  size_t t0 = 0;
  for (size_t i = 0; i < rows; i++) {
    const size_t n = tokenCount.length != 0 ? tokenCount[i] : 0;
    const size_t start = t0;
    t0 += n;
    if (t0 > tokens) ThrowCoded(env, "ERR_INVALID_ARG", "tokenCount adds up to more than tokenIds");
    const int64_t rec = rowRecord[i];
    if (rec < 0) continue;  // a row the guard skips (no request bound to its slot)
    if ((rec & 1) != 0 || rec + recordWords > stateWords) ThrowCoded(env, "ERR_INVALID_ARG", "rowRecord[" + std::to_string(i) + "] is outside the state");
    const int32_t muted = rowMuted[i];
    // a hit's figures go to out + 2 of the next record; keep writes the row and type before them
    auto next = [&]() { return hits.data + nHits * kHitWords; };
    auto keep = [&](double type) {
      double* out = next();
      out[0] = static_cast<double>(i);
      out[1] = type;
      nHits++;
    };
    if (repeatOn && n > 0 && (muted & kMuteRepeat) == 0 && rep.Step(m, rec, tokenIds.data + start, n, next() + 2)) keep(kTokenRepeat);
    if (specOn && draftLen.length != 0 && draftLen[i] > 0 && (muted & kMuteSpec) == 0 && spec.Step(m, rec, draftLen[i], accepted[i], next() + 2)) keep(kSpec);
    if (garbledOn && n > 0 && logprobs.length != 0 && (muted & kMuteGarbled) == 0 &&
        gar.Step(m, rec, logprobs.data + start, ranks.length != 0 ? ranks.data + start : nullptr, n, next() + 2)) {
      keep(kGarbled);
    }
  }
  return Napi::Number::New(env, static_cast<double>(nHits));
}

}  // namespace

void RegisterDetectorPass(Napi::Env env, Napi::Object exports) {
  const std::string problem = LayoutProblem();
  if (!problem.empty()) ThrowCoded(env, "ERR_NATIVE_LAYOUT", "detector record layout: " + problem);
  exports.Set("detectStep", Napi::Function::New(env, JsDetectStep, "detectStep"));

  Napi::Object layout = Napi::Object::New(env);
  Napi::Object params = Napi::Object::New(env);
  for (int i = 0; i < kParamCount; i++) params.Set(kParamNames[i], Napi::Number::New(env, i));
  params.Freeze();
  layout.Set("params", params);
  layout.Set("paramCount", Napi::Number::New(env, kParamCount));
  layout.Set("hitWords", Napi::Number::New(env, kHitWords));
  Napi::Array types = Napi::Array::New(env, 3);
  for (uint32_t i = 0; i < 3; i++) types.Set(i, Napi::String::New(env, kHitTypes[i]));
  types.Freeze();
  layout.Set("hitTypes", types);
  Napi::Object mute = Napi::Object::New(env);
  mute.Set("token_repeat", Napi::Number::New(env, kMuteRepeat));
  mute.Set("logits_finite", Napi::Number::New(env, kMuteLogitsFinite));
  mute.Set("spec_acceptance", Napi::Number::New(env, kMuteSpec));
  mute.Set("garbled", Napi::Number::New(env, kMuteGarbled));
  mute.Set("rank_divergence", Napi::Number::New(env, kMuteRankDivergence));
  mute.Freeze();
  layout.Set("muteBits", mute);
  for (const Header& h : kHeaders) {
    Napi::Object o = Napi::Object::New(env);
    for (size_t i = 0; i < h.count; i++) o.Set(h.words[i].name, Napi::Number::New(env, h.words[i].offset));
    o.Set("headerWords", Napi::Number::New(env, h.headerWords));
    o.Freeze();
    layout.Set(h.detector, o);
  }
  layout.Freeze();
  exports.Set("detectorLayout", layout);
}

}  // namespace wavebus
