// The C API (blkps.h) over blkps::Model.

#include <cerrno>
#include <cstdio>
#include <memory>
#include <new>
#include <string>

#include "blkps/blkps.h"
#include "blkps/model.hpp"

struct blkps_model {
  std::unique_ptr<blkps::Model> model;
};

extern "C" {

int blkps_open(const char* target, const blkps_open_options* opts,
               blkps_model** out, char* errbuf, size_t errlen) {
  std::string error;
  int error_code = -ENOMEM;
  try {
    blkps::OpenOptions options;
    if (opts != nullptr) {
      options.request_bytes = opts->request_bytes;
      options.queue_depth = opts->queue_depth;
      if (opts->initiator_name != nullptr) {
        options.initiator_name = opts->initiator_name;
      }
    }
    std::unique_ptr<blkps::Model> model =
        blkps::Model::Open(target, options, &error, &error_code);
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

uint64_t blkps_size_bytes(const blkps_model* m) {
  return m->model->size_bytes();
}

uint32_t blkps_logical_block_size(const blkps_model* m) {
  return m->model->logical_block_size();
}

int blkps_push(blkps_model* m, uint64_t first_param, const float* grad,
               uint64_t count) {
  return m->model->Push(first_param, grad, count);
}

int blkps_pull(blkps_model* m, uint64_t first_param, float* weights,
               uint64_t count) {
  return m->model->Pull(first_param, weights, count);
}

int blkps_write_bytes(blkps_model* m, uint64_t offset, const void* buf,
                      uint64_t len) {
  return m->model->WriteBytes(offset, buf, len);
}

int blkps_read_bytes(blkps_model* m, uint64_t offset, void* buf, uint64_t len) {
  return m->model->ReadBytes(offset, buf, len);
}

int blkps_sync(blkps_model* m) { return m->model->Sync(); }

const char* blkps_last_error(const blkps_model* m) {
  return m->model->last_error().c_str();
}

}  // extern "C"
