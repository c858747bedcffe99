// The C API (blkps.h) over blkps::Model.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "blkps/blkps.h"
#include "blkps/engine.hpp"
#include "blkps/feature_id.h"
#include "blkps/model.hpp"
#include "shard_layout.h"
#include "stripe_map.h"

struct blkps_model {
  std::unique_ptr<blkps::Model> model;
};

namespace {

// `text` as a JSON string.
std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonTargets(const std::vector<blkps::ShardLayout::Shard>& list) {
  std::string out = "[";
  for (size_t i = 0; i < list.size(); ++i) out += (i == 0 ? "" : ", ") + JsonString(list[i].target);
  return out + "]";
}

blkps::OpenOptions ToOpenOptions(const blkps_open_options& opts) {
  blkps::OpenOptions options;
  options.request_bytes = opts.request_bytes;
  options.queue_depth = opts.queue_depth;
  if (opts.initiator_name != nullptr) {
    options.initiator_name = opts.initiator_name;
  }
  if (opts.dtype != nullptr) options.dtype = opts.dtype;
  options.sessions = opts.sessions;
  return options;
}

}  // namespace

extern "C" {

int blkps_open(const char* target, const blkps_open_options* opts, blkps_model** out, char* errbuf, size_t errlen) {
  std::string error;
  int error_code = -ENOMEM;
  try {
    blkps::OpenOptions options;
    if (opts != nullptr) options = ToOpenOptions(*opts);
    std::unique_ptr<blkps::Model> model = blkps::Model::Open(target, options, &error, &error_code);
    if (model != nullptr) {
      *out = new blkps_model{std::move(model)};
      return 0;
    }
  } catch (const std::bad_alloc&) {
    error = "blkps: out of memory opening a model";
  }
  if (errbuf != nullptr && errlen > 0) {
    snprintf(errbuf, errlen, "%s", error.c_str());
  }
  return error_code;
}

void blkps_close(blkps_model* m) { delete m; }

uint64_t blkps_size_bytes(const blkps_model* m) { return m->model->size_bytes(); }

uint64_t blkps_param_capacity(const blkps_model* m) { return m->model->param_capacity(); }

uint32_t blkps_logical_block_size(const blkps_model* m) { return m->model->logical_block_size(); }

int blkps_push(blkps_model* m, uint64_t first_param, const float* grad, uint64_t count) {
  return m->model->Push(first_param, grad, count);
}

int blkps_pull(blkps_model* m, uint64_t first_param, float* weights, uint64_t count) {
  return m->model->Pull(first_param, weights, count);
}

int blkps_exchange(blkps_model* m, uint64_t first_param, const float* grad, float* out, uint64_t count) {
  return m->model->Exchange(first_param, grad, out, count);
}

int blkps_push16(blkps_model* m, uint64_t first_param, const uint16_t* grad, uint64_t count) {
  return m->model->Push16(first_param, grad, count);
}

int blkps_pull16(blkps_model* m, uint64_t first_param, uint16_t* weights, uint64_t count) {
  return m->model->Pull16(first_param, weights, count);
}

int blkps_exchange16(blkps_model* m, uint64_t first_param, const uint16_t* grad, uint16_t* out, uint64_t count) {
  return m->model->Exchange16(first_param, grad, out, count);
}

int blkps_submit_push(blkps_model* m, uint64_t first_param, const float* grad, uint64_t count, blkps_ticket* ticket) {
  return m->model->SubmitPush(first_param, grad, count, ticket);
}

int blkps_submit_pull(blkps_model* m, uint64_t first_param, float* weights, uint64_t count, blkps_ticket* ticket) {
  return m->model->SubmitPull(first_param, weights, count, ticket);
}

int blkps_submit_exchange(blkps_model* m, uint64_t first_param, const float* grad, float* out, uint64_t count,
                          blkps_ticket* ticket) {
  return m->model->SubmitExchange(first_param, grad, out, count, ticket);
}

int blkps_submit_push16(blkps_model* m, uint64_t first_param, const uint16_t* grad, uint64_t count,
                        blkps_ticket* ticket) {
  return m->model->SubmitPush16(first_param, grad, count, ticket);
}

int blkps_submit_pull16(blkps_model* m, uint64_t first_param, uint16_t* weights, uint64_t count, blkps_ticket* ticket) {
  return m->model->SubmitPull16(first_param, weights, count, ticket);
}

int blkps_submit_exchange16(blkps_model* m, uint64_t first_param, const uint16_t* grad, uint16_t* out, uint64_t count,
                            blkps_ticket* ticket) {
  return m->model->SubmitExchange16(first_param, grad, out, count, ticket);
}

int blkps_complete(blkps_model* m, blkps_completion* out, size_t max, int timeout_ms) {
  std::vector<blkps::Model::Completion> ended;
  const int n = m->model->Complete(&ended, max, timeout_ms);
  for (int k = 0; k < n; ++k) {
    out[k] = blkps_completion();
    out[k].ticket = ended[k].ticket;
    out[k].result = ended[k].result;
    snprintf(out[k].error, sizeof out[k].error, "%s", ended[k].error.c_str());
  }
  return n;
}

uint64_t blkps_outstanding(const blkps_model* m) { return m->model->outstanding(); }

void blkps_wake(blkps_model* m) { m->model->Wake(); }

int blkps_write_bytes(blkps_model* m, uint64_t offset, const void* buf, uint64_t len) {
  return m->model->WriteBytes(offset, buf, len);
}

int blkps_read_bytes(blkps_model* m, uint64_t offset, void* buf, uint64_t len) {
  return m->model->ReadBytes(offset, buf, len);
}

int blkps_pull_rows(blkps_model* m, const uint64_t* ids, uint64_t n, uint64_t width, float* rows) {
  return m->model->PullRows(ids, n, width, rows);
}

int blkps_push_rows(blkps_model* m, const uint64_t* ids, uint64_t n, uint64_t width, const float* grads) {
  return m->model->PushRows(ids, n, width, grads);
}

uint64_t blkps_table_width(const blkps_model* m) { return m->model->table_width(); }
int blkps_table_hashed(const blkps_model* m) { return m->model->table_hashed() ? 1 : 0; }

int blkps_sync(blkps_model* m) { return m->model->Sync(); }

uint64_t blkps_pushed_bytes_lost(const blkps_model* m) { return m->model->pushed_bytes_lost(); }

uint64_t blkps_reconnects(const blkps_model* m) { return m->model->reconnects(); }

double blkps_reconnect_seconds(const blkps_model* m) { return m->model->reconnect_seconds(); }

void blkps_control_layout_get(blkps_control_layout* out) {
  *out = blkps_control_layout();
  out->format_version = BLKPS_CONTROL_FORMAT_VERSION;
  out->status_offset = BLKPS_CONTROL_STATUS_OFFSET;
  out->status_bytes = BLKPS_CONTROL_STATUS_BYTES;
  out->commands_offset = BLKPS_CONTROL_COMMANDS_OFFSET;
  out->commands_bytes = BLKPS_CONTROL_COMMANDS_BYTES;
  out->counters_offset = BLKPS_CONTROL_COUNTERS_OFFSET;
  out->counters_bytes = BLKPS_CONTROL_COUNTERS_BYTES;
  out->weights_offset = BLKPS_CONTROL_WEIGHTS_OFFSET;
  out->status_keys = BLKPS_STATUS_KEYS;
  out->status_checkpoint_keys = BLKPS_STATUS_CHECKPOINT_KEYS;
  out->status_learner_keys = BLKPS_STATUS_LEARNER_KEYS;
  out->exchange_bytes = BLKPS_CONTROL_EXCHANGE_BYTES;
  out->receipt_unit = BLKPS_CONTROL_RECEIPT_UNIT;
}

int blkps_control_read_counters(blkps_model* m, blkps_control_counters* out) {
  return m->model->ReadControlCounters(out);
}

int blkps_control_read_receipt(blkps_model* m, uint32_t lun, uint64_t device_bytes, blkps_control_receipt* header,
                               uint32_t* counts) {
  if (counts == nullptr) return m->model->ReadControlReceipt(lun, device_bytes, header, nullptr);
  std::vector<uint32_t> read;
  const int rc = m->model->ReadControlReceipt(lun, device_bytes, header, &read);
  if (rc == 0) std::copy(read.begin(), read.end(), counts);
  return rc;
}

uint64_t blkps_control_receipt_units(uint64_t device_bytes) { return blkps_control_receipt_unit_count(device_bytes); }

const char* blkps_last_error(const blkps_model* m) { return m->model->last_error().c_str(); }

size_t blkps_struct_size(const char* name) {
  static const struct {
    const char* name;
    size_t bytes;
  } kStructs[] = {
      {"blkps_open_options", sizeof(blkps_open_options)},
      {"blkps_engine_options", sizeof(blkps_engine_options)},
      {"blkps_engine_metrics", sizeof(blkps_engine_metrics)},
      {"blkps_control_layout", sizeof(blkps_control_layout)},
      {"blkps_control_counters", sizeof(blkps_control_counters)},
      {"blkps_control_receipt", sizeof(blkps_control_receipt)},
      {"blkps_completion", sizeof(blkps_completion)},
  };
  for (const auto& s : kStructs) {
    if (name != nullptr && std::strcmp(name, s.name) == 0) return s.bytes;
  }
  return 0;
}

int blkps_layout_describe(const char* path, char* out, size_t out_len) {
  blkps::ShardLayout layout;
  const blkps::Status status = blkps::ReadShardLayout(path, &layout);
  std::string text;
  if (status.ok()) {
    const bool hashed = layout.kind == blkps::ShardLayout::Kind::kHashed;
    text = "{\"kind\": " + JsonString(hashed ? "hashed" : "striped") +
           ", \"stripe_unit\": " + std::to_string(layout.stripe_unit) +
           ", \"dtype\": " + JsonString(blkps::wire::DtypeName(layout.dtype)) +
           ", \"shards\": " + JsonTargets(layout.shards) + ", \"controls\": " + JsonTargets(layout.controls) + "}";
  } else {
    text = status.message();
  }
  if (out_len > 0) snprintf(out, out_len, "%s", text.c_str());
  if (!status.ok()) return -status.code();
  return text.size() < out_len ? 0 : -ERANGE;
}

void blkps_stripe_scatter(uint64_t stripe_unit, uint32_t shards, const void* model, uint64_t model_bytes,
                          void* const* shard_parts) {
  std::vector<blkps::StripePiece> pieces;
  blkps::StripeMap(stripe_unit, shards, model_bytes).Map(0, model_bytes, &pieces);
  const char* from = static_cast<const char*>(model);
  for (const blkps::StripePiece& piece : pieces) {
    std::memcpy(static_cast<char*>(shard_parts[piece.shard]) + piece.shard_offset, from, piece.length);
    from += piece.length;
  }
}

void blkps_feature_id_shards(const uint64_t* ids, size_t n, uint32_t shards, uint32_t* out) {
  for (size_t k = 0; k < n; ++k) out[k] = blkps_feature_id_shard(ids[k], shards);
}

// ---- Learner engine ----------------------------------------------------------

struct blkps_engine {
  std::unique_ptr<blkps::Engine> engine;
};

void blkps_engine_options_init(blkps_engine_options* opts) {
  *opts = blkps_engine_options();
  opts->double_buffering = 1;
  opts->adaptive_pull = 1;
  opts->smoothing = 0.25;
}

int blkps_engine_open(const char* target, const blkps_engine_options* opts, blkps_engine** out, char* errbuf,
                      size_t errlen) {
  std::string error;
  int error_code = -ENOMEM;
  try {
    blkps_engine_options defaults;
    blkps_engine_options_init(&defaults);
    if (opts == nullptr) opts = &defaults;
    blkps::EngineOptions options;
    options.open = ToOpenOptions(opts->open);
    options.first_param = opts->first_param;
    options.param_count = opts->param_count;
    options.double_buffering = opts->double_buffering != 0;
    options.adaptive_pull = opts->adaptive_pull != 0;
    options.smoothing = opts->smoothing;
    if (opts->control_target != nullptr) {
      options.control_target = opts->control_target;
    }
    options.drop_ratio = opts->drop_ratio;
    options.drop_run_params = opts->drop_run_params;
    options.drop_group_params = opts->drop_group_params;
    std::unique_ptr<blkps::Engine> engine = blkps::Engine::Open(target, options, &error, &error_code);
    if (engine != nullptr) {
      *out = new blkps_engine{std::move(engine)};
      return 0;
    }
  } catch (const std::bad_alloc&) {
    error = "blkps: out of memory opening an engine";
  }
  if (errbuf != nullptr && errlen > 0) {
    snprintf(errbuf, errlen, "%s", error.c_str());
  }
  return error_code;
}

uint64_t blkps_engine_param_count(const blkps_engine* e) { return e->engine->count(); }

const float* blkps_engine_weights(const blkps_engine* e) { return e->engine->weights(); }

float* blkps_engine_gradient(blkps_engine* e) { return e->engine->gradient(); }

int blkps_engine_step(blkps_engine* e) { return e->engine->Step(); }

int blkps_engine_finish(blkps_engine* e) { return e->engine->Finish(); }

void blkps_engine_last_metrics(const blkps_engine* e, blkps_engine_metrics* out) {
  const blkps::IterationMetrics& m = e->engine->last_metrics();
  out->iteration = m.iteration;
  out->compute_s = m.compute_s;
  out->stall_s = m.stall_s;
  out->push_s = m.push_s;
  out->pull_s = m.pull_s;
  out->bubble_s = m.bubble_s;
  out->staleness = m.staleness;
  out->concurrent = m.concurrent ? 1 : 0;
}

uint64_t blkps_engine_pushed_bytes_lost(const blkps_engine* e) { return e->engine->pushed_bytes_lost(); }

uint64_t blkps_engine_gradients_pushed(const blkps_engine* e) { return e->engine->gradients_pushed(); }

int blkps_engine_stop_requested(blkps_engine* e) { return e->engine->stop_requested() ? 1 : 0; }

uint64_t blkps_engine_params_pushed(const blkps_engine* e) { return e->engine->params_pushed(); }

const float* blkps_engine_residual(const blkps_engine* e) { return e->engine->residual(); }

const char* blkps_engine_last_error(const blkps_engine* e) { return e->engine->last_error().c_str(); }

void blkps_engine_close(blkps_engine* e) { delete e; }

}  // extern "C"
