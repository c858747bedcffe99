// The C++ core of one blkps logical unit: its options and its model.
#include "lu.h"

#include <cstdio>
#include <memory>
#include <string>

#include "lu_options.h"
#include "model.h"

struct blkps_lu {
  blkps::LuOptions options;
  std::string path;
  std::unique_ptr<blkps::Model> model;  // null until opened
};

namespace {

void SetError(char* err, size_t errlen, const std::string& msg) {
  if (err && errlen) std::snprintf(err, errlen, "%s", msg.c_str());
}

blkps_io_result ToIoResult(const blkps::Status& s, char* err, size_t errlen) {
  if (s.ok()) return BLKPS_IO_OK;
  SetError(err, errlen, s.message());
  return s.code() == blkps::Status::Code::kOutOfRange ? BLKPS_IO_OUT_OF_RANGE : BLKPS_IO_BAD_DATA;
}

}  // namespace

extern "C" {

blkps_lu* blkps_lu_create(const char* bsopts, char* err, size_t errlen) {
  auto lu = std::make_unique<blkps_lu>();
  blkps::Status s = blkps::ParseLuOptions(bsopts ? bsopts : "", &lu->options);
  if (!s.ok()) {
    SetError(err, errlen, s.message());
    return nullptr;
  }
  return lu.release();
}

void blkps_lu_destroy(blkps_lu* lu) { delete lu; }

int blkps_lu_open(blkps_lu* lu, const char* path, uint64_t* size_bytes, char* err, size_t errlen) {
  std::unique_ptr<blkps::Model> model;
  blkps::Status s = blkps::Model::Create(lu->options.model, &model);
  if (!s.ok()) {
    SetError(err, errlen, s.message());
    return -1;
  }
  lu->path = path ? path : "";
  lu->model = std::move(model);
  *size_bytes = lu->model->size_bytes();
  return 0;
}

void blkps_lu_close(blkps_lu* lu) { lu->model.reset(); }

blkps_io_result blkps_lu_read(blkps_lu* lu, uint64_t offset, void* buf, uint64_t len, char* err,
                              size_t errlen) {
  if (!lu->model) return BLKPS_IO_NOT_READY;
  return ToIoResult(lu->model->Read(offset, buf, len), err, errlen);
}

blkps_io_result blkps_lu_write(blkps_lu* lu, uint64_t offset, const void* buf, uint64_t len,
                               char* err, size_t errlen) {
  if (!lu->model) return BLKPS_IO_NOT_READY;
  return ToIoResult(lu->model->ApplyGradient(offset, buf, len), err, errlen);
}

blkps_io_result blkps_lu_sync(blkps_lu* lu, char*, size_t) {
  // The model lives in memory; durable checkpoints on SYNCHRONIZE CACHE come
  // with the checkpoint module.
  return lu->model ? BLKPS_IO_OK : BLKPS_IO_NOT_READY;
}

}  // extern "C"
