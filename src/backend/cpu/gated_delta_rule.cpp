#include "backend/cpu/gated_delta_rule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/math.h"
#include "backend/op_checks.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace qspec::cpu {

namespace {

constexpr float kL2NormEps = 1e-6f;

// x * rsqrt(sum(x^2) + eps) * extra_scale, as HF's l2norm followed by the query scaling.
void l2_normalize(const float* x, int64_t n, float extra_scale, float* out) {
  const float inv_norm = 1.0f / std::sqrt(sum_of_squares(x, n) + kL2NormEps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv_norm * extra_scale;
}

// One value head's inputs over all T tokens, row-major [T, d]: q and k L2-normalised, q also scaled by
// dk^-0.5.
struct HeadSequence {
  int64_t tokens, dk, dv;
  std::vector<float> q, k, v, beta, g;

  HeadSequence(const Tensor& qkv, const Tensor& beta_in, const Tensor& g_in, const GdnShape& shape, int head)
      : tokens(qkv.rows),
        dk(shape.key_head_dim),
        dv(shape.value_head_dim),
        q(static_cast<size_t>(tokens * dk)),
        k(static_cast<size_t>(tokens * dk)),
        v(static_cast<size_t>(tokens * dv)),
        beta(static_cast<size_t>(tokens)),
        g(static_cast<size_t>(tokens)) {
    const int key_head = head / (shape.num_value_heads / shape.num_key_heads);
    const int64_t q_offset = key_head * dk;
    const int64_t k_offset = int64_t{shape.num_key_heads} * dk + key_head * dk;
    const int64_t v_offset = 2 * int64_t{shape.num_key_heads} * dk + head * dv;
    // HF: query * (1 / dk ** 0.5), a Python double rounded to fp32.
    const auto query_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
    for (int64_t t = 0; t < tokens; ++t) {
      const float* row = qkv.row<float>(t);
      l2_normalize(row + q_offset, dk, query_scale, &q[t * dk]);
      l2_normalize(row + k_offset, dk, 1.0f, &k[t * dk]);
      std::copy_n(row + v_offset, dv, &v[t * dv]);
      beta[t] = beta_in.row<float>(t)[head];
      g[t] = g_in.row<float>(t)[head];
    }
  }
};

// The head's state S [dk, dv] copied out of (and back into) the possibly strided state tensor.
std::vector<float> load_state(const Tensor& state, int head, int64_t dk, int64_t dv) {
  std::vector<float> s(static_cast<size_t>(dk * dv));
  for (int64_t i = 0; i < dk; ++i) std::copy_n(state.row<float>(head * dk + i), dv, &s[i * dv]);
  return s;
}

void store_state(const Tensor& state, int head, int64_t dk, int64_t dv, const std::vector<float>& s) {
  for (int64_t i = 0; i < dk; ++i) std::copy_n(&s[i * dv], dv, state.row<float>(head * dk + i));
}

// out[j] = sum_i x[i] * m[i][j] for a row-major [rows, cols] matrix m.
void vector_matrix(const float* x, const float* m, int64_t rows, int64_t cols, float* out) {
  std::fill_n(out, cols, 0.0f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[j] += x[i] * m[i * cols + j];
}

// S += k delta^T: a token's update, the same in the recurrence and in the replay of its record.
void add_key_delta(std::vector<float>& s, const float* k, const float* delta, int64_t dk, int64_t dv) {
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t j = 0; j < dv; ++j) s[i * dv + j] += k[i] * delta[j];
}

// A replay record gets the head's decays and deltas, and its keys from the key head's first value head.
void recurrent_head(const HeadSequence& in, std::vector<float>& s, const Tensor& out, int head,
                    const GdnReplayRows& replay, int heads_per_key) {
  const int64_t dk = in.dk, dv = in.dv;
  std::vector<float> prediction(static_cast<size_t>(dv)), delta(static_cast<size_t>(dv));
  for (int64_t t = 0; t < in.tokens; ++t) {
    const float* k = &in.k[t * dk];
    const float* q = &in.q[t * dk];
    const float* v = &in.v[t * dv];
    const float decay = std::exp(in.g[t]);
    for (float& x : s) x *= decay;
    vector_matrix(k, s.data(), dk, dv, prediction.data());
    for (int64_t j = 0; j < dv; ++j) delta[j] = (v[j] - prediction[j]) * in.beta[t];
    add_key_delta(s, k, delta.data(), dk, dv);
    vector_matrix(q, s.data(), dk, dv, out.row<float>(t) + head * dv);
    if (!replay.empty()) {
      replay.decays.row<float>(t)[head] = decay;
      std::copy_n(delta.data(), dv, replay.deltas.row<float>(t) + head * dv);
      if (head % heads_per_key == 0)
        std::copy_n(k, dk, replay.keys.row<float>(t) + head / heads_per_key * dk);
    }
  }
}

// HF's chunked algorithm over chunks of C tokens. The last chunk is not padded: HF's zero rows (k = v = beta
// = g = 0) add exact zeros to every sum, so leaving them out gives the same values.
void chunked_head(const HeadSequence& in, std::vector<float>& s, const Tensor& out, int head, int64_t chunk) {
  const int64_t dk = in.dk, dv = in.dv;
  std::vector<float> cumulative_g(static_cast<size_t>(chunk));
  std::vector<float> k_beta(static_cast<size_t>(chunk * dk));
  std::vector<float> a(static_cast<size_t>(chunk * chunk));     // (k_beta k^T) * decay, strictly lower
  std::vector<float> a_qk(static_cast<size_t>(chunk * chunk));  // (q k^T) * decay, lower with diagonal
  std::vector<float> u(static_cast<size_t>(chunk * dv));        // (I + A)^-1 v_beta
  std::vector<float> w(static_cast<size_t>(chunk * dk));        // (I + A)^-1 (k_beta * exp(G))
  std::vector<float> v_new(static_cast<size_t>(chunk * dv));
  std::vector<float> w_times_state(static_cast<size_t>(dv));
  std::vector<float> q_decayed(static_cast<size_t>(dk));
  for (int64_t start = 0; start < in.tokens; start += chunk) {
    const int64_t len = std::min(chunk, in.tokens - start);
    const float* q = &in.q[start * dk];
    const float* k = &in.k[start * dk];
    const float* v = &in.v[start * dv];
    const float* beta = &in.beta[start];
    float running = 0.0f;
    for (int64_t t = 0; t < len; ++t) {
      running += in.g[start + t];
      cumulative_g[t] = running;
    }
    for (int64_t t = 0; t < len; ++t)
      for (int64_t i = 0; i < dk; ++i) k_beta[t * dk + i] = k[t * dk + i] * beta[t];
    for (int64_t i = 0; i < len; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const float decay = std::exp(cumulative_g[i] - cumulative_g[j]);
        a[i * chunk + j] = dot(&k_beta[i * dk], &k[j * dk], dk) * decay;
        a_qk[i * chunk + j] = dot(&q[i * dk], &k[j * dk], dk) * decay;
      }
    // Forward substitution with the unit lower-triangular (I + strict_lower(A)): the diagonal of A is
    // ignored.
    for (int64_t i = 0; i < len; ++i) {
      float* u_row = &u[i * dv];
      float* w_row = &w[i * dk];
      const float growth = std::exp(cumulative_g[i]);
      for (int64_t j = 0; j < dv; ++j) u_row[j] = v[i * dv + j] * beta[i];
      for (int64_t j = 0; j < dk; ++j) w_row[j] = k_beta[i * dk + j] * growth;
      for (int64_t p = 0; p < i; ++p) {
        const float coefficient = a[i * chunk + p];
        for (int64_t j = 0; j < dv; ++j) u_row[j] -= coefficient * u[p * dv + j];
        for (int64_t j = 0; j < dk; ++j) w_row[j] -= coefficient * w[p * dk + j];
      }
    }
    // v_new = U - W S ; O = (q * exp(G)) S + A_qk v_new  (S is the state before this chunk)
    for (int64_t i = 0; i < len; ++i) {
      vector_matrix(&w[i * dk], s.data(), dk, dv, w_times_state.data());
      for (int64_t j = 0; j < dv; ++j) v_new[i * dv + j] = u[i * dv + j] - w_times_state[j];
    }
    for (int64_t i = 0; i < len; ++i) {
      const float growth = std::exp(cumulative_g[i]);
      for (int64_t j = 0; j < dk; ++j) q_decayed[j] = q[i * dk + j] * growth;
      float* o = out.row<float>(start + i) + head * dv;
      vector_matrix(q_decayed.data(), s.data(), dk, dv, o);
      for (int64_t p = 0; p <= i; ++p)
        for (int64_t j = 0; j < dv; ++j) o[j] += a_qk[i * chunk + p] * v_new[p * dv + j];
    }
    // S = exp(G_last) S + sum_t (k_t exp(G_last - G_t)) v_new_t^T
    const float last = cumulative_g[len - 1];
    const float chunk_decay = std::exp(last);
    for (float& x : s) x *= chunk_decay;
    for (int64_t t = 0; t < len; ++t) {
      const float key_decay = std::exp(last - cumulative_g[t]);
      for (int64_t i = 0; i < dk; ++i) {
        const float coefficient = k[t * dk + i] * key_decay;
        for (int64_t j = 0; j < dv; ++j) s[i * dv + j] += coefficient * v_new[t * dv + j];
      }
    }
  }
}

// Runs head_rule(head, state) for every value head, heads spread over threads; the state is written back
// when `advance`.
template <typename HeadRule>
void for_each_head(const Tensor& state, const GdnShape& shape, bool advance, HeadRule head_rule) {
  ThreadPool::global().parallel_for(
      static_cast<size_t>(shape.num_value_heads), [&](size_t begin, size_t end) {
        for (auto head = static_cast<int>(begin); head < static_cast<int>(end); ++head) {
          std::vector<float> s = load_state(state, head, shape.key_head_dim, shape.value_head_dim);
          head_rule(head, s);
          if (advance) store_state(state, head, shape.key_head_dim, shape.value_head_dim, s);
        }
      });
}

// The per-token recurrence over every head (arguments checked by the caller).
void run_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                   const Tensor& state, const GdnShape& shape, const GdnStateUpdate& update) {
  const int heads_per_key = shape.num_value_heads / shape.num_key_heads;
  for_each_head(state, shape, update.advance, [&](int head, std::vector<float>& s) {
    recurrent_head(HeadSequence(qkv, beta, g, shape, head), s, out, head, update.replay, heads_per_key);
  });
}

// HF's chunked algorithm over every head (arguments checked by the caller).
void run_chunked(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                 const Tensor& state, const GdnShape& shape, bool advance, int64_t chunk_size) {
  for_each_head(state, shape, advance, [&](int head, std::vector<float>& s) {
    chunked_head(HeadSequence(qkv, beta, g, shape, head), s, out, head, chunk_size);
  });
}

void check_args(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                const Tensor& state, const GdnShape& shape, const GdnStateUpdate& update) {
  check_gdn_shape(shape);
  check_gated_delta_rule_args(out, qkv, beta, g, state, shape, update);
}

}  // namespace

void gated_delta_rule_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                                const Tensor& state, const GdnShape& shape) {
  check_args(out, qkv, beta, g, state, shape, true);
  run_recurrent(out, qkv, beta, g, state, shape, true);
}

void replay_gated_delta_rule(const GdnReplayRows& replay, const Tensor& state, const GdnShape& shape) {
  const int64_t dk = shape.key_head_dim, dv = shape.value_head_dim;
  const int heads_per_key = shape.num_value_heads / shape.num_key_heads;
  for_each_head(state, shape, true, [&](int head, std::vector<float>& s) {
    for (int64_t t = 0; t < replay.keys.rows; ++t) {
      const float decay = replay.decays.row<float>(t)[head];
      for (float& x : s) x *= decay;
      add_key_delta(s, replay.keys.row<float>(t) + head / heads_per_key * dk,
                    replay.deltas.row<float>(t) + head * dv, dk, dv);
    }
  });
}

void gated_delta_rule_chunked(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                              const Tensor& state, const GdnShape& shape, int chunk_size) {
  if (chunk_size <= 0) fail("gated_delta_rule: chunk size must be positive, got {}", chunk_size);
  check_args(out, qkv, beta, g, state, shape, true);
  run_chunked(out, qkv, beta, g, state, shape, true, chunk_size);
}

void CpuBackend::gated_delta_rule(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                                  const Tensor& state, const GdnShape& shape, const GdnStateUpdate& update) {
  check_args(out, qkv, beta, g, state, shape, update);
  if (qkv.rows <= kGdnRecurrentMaxTokens)
    run_recurrent(out, qkv, beta, g, state, shape, update);
  else
    run_chunked(out, qkv, beta, g, state, shape, update.advance, kGdnChunkSize);
}

}  // namespace qspec::cpu
