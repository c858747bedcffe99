// The C++ core of one blkps logical unit: its options and its model.
#include "lu.h"

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "lu_options.h"
#include "model.h"

struct blkps_lu {
  std::string bsopts;
  blkps::LuOptions options;
  std::shared_ptr<blkps::Model> model;  // null until opened
};

namespace {

// All LUNs whose --backing-store names the same model are windows onto one
// Model instance, e.g. one LUN per learner slot. The first LUN to open a name
// creates the model from its --bsopts; a LUN joining it must give the same
// --bsopts. The model lives while any LUN has it open.
class ModelRegistry {
 public:
  static ModelRegistry& Get() {
    static ModelRegistry registry;
    return registry;
  }

  blkps::Status Open(const std::string& name, const blkps_lu& lu, std::shared_ptr<blkps::Model>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = models_[name];
    if (std::shared_ptr<blkps::Model> open = entry.model.lock()) {
      if (entry.bsopts != lu.bsopts) {
        return blkps::Status::InvalidArgument("model '" + name + "' is already served with --bsopts '" +
                                              entry.bsopts + "'; a LUN joining it must give the same");
      }
      *out = open;
      return blkps::Status::OK();
    }
    std::unique_ptr<blkps::Model> model;
    blkps::Status s = blkps::Model::Create(lu.options.model, &model);
    if (!s.ok()) return s;
    *out = std::move(model);
    entry = Entry{*out, lu.bsopts};
    return blkps::Status::OK();
  }

 private:
  struct Entry {
    std::weak_ptr<blkps::Model> model;
    std::string bsopts;  // what created it
  };
  std::mutex mu_;
  std::map<std::string, Entry> models_;
};

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
  lu->bsopts = bsopts ? bsopts : "";
  blkps::Status s = blkps::ParseLuOptions(lu->bsopts, &lu->options);
  if (!s.ok()) {
    SetError(err, errlen, s.message());
    return nullptr;
  }
  return lu.release();
}

void blkps_lu_destroy(blkps_lu* lu) { delete lu; }

int blkps_lu_open(blkps_lu* lu, const char* path, uint64_t* size_bytes, char* err, size_t errlen) {
  blkps::Status s = ModelRegistry::Get().Open(path ? path : "", *lu, &lu->model);
  if (!s.ok()) {
    SetError(err, errlen, s.message());
    return -1;
  }
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
