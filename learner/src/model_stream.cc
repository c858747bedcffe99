// Model's submissions (model.hpp "Streaming"): each is checked and planned
// here, on the caller's thread, as the synchronous call would be, and then
// handed to the Model's Stream (stream.h), which runs it on its own thread.

#include <algorithm>
#include <cerrno>
#include <new>
#include <system_error>

#include "blkps/model.hpp"
#include "model_checks.h"
#include "stream.h"

namespace blkps {

int Model::Submit(const char* operation, uint64_t first_param, uint64_t count, const void* grad, void* out,
                  bool values16, Ticket* ticket) {
  uint64_t offset = 0, length = 0;
  Status status = values16 ? Check16(operation, dtype_) : Status();
  if (status.ok()) {
    status = ParamsToBytes(operation, first_param, count, device_->size_bytes(), dtype_, &offset, &length);
  }
  if (status.ok() && values16 && grad != nullptr) {
    status = CheckFinite16(operation, first_param, static_cast<const uint16_t*>(grad), count);
  }
  if (!status.ok()) return Record(status);
  try {
    auto submission = std::make_unique<Submission>();
    submission->kind = grad == nullptr  ? Submission::Kind::kPull
                       : out == nullptr ? Submission::Kind::kPush
                                        : Submission::Kind::kExchange;
    submission->dtype = dtype_;
    // A write only reads its buffer; TransferPlan's iovecs are not const.
    void* sent = const_cast<void*>(grad);
    void* received = out;
    const bool convert = !values16 && dtype_ != wire::Dtype::kFloat32;
    if (convert && grad != nullptr) {
      status = Narrow(operation, first_param, static_cast<const float*>(grad), count, &submission->wire);
      if (!status.ok()) return Record(status);
      sent = submission->wire.data();
    }
    if (convert && out != nullptr) {
      submission->wire.resize(count);
      submission->widen_to = static_cast<float*>(out);
      received = submission->wire.data();
    }
    const uint32_t block = device_->logical_block_size();
    submission->first_block = offset / block;
    submission->end_block = (offset + length + block - 1) / block;
    const uint64_t request_bytes =
        submission->kind == Submission::Kind::kExchange ? exchange_request_bytes_ : request_bytes_;
    if (length > 0 && grad != nullptr) {
      submission->write.reset(new TransferPlan(Direction::kWrite, offset, sent, length, block, request_bytes));
    }
    if (length > 0 && out != nullptr) {
      submission->read.reset(new TransferPlan(Direction::kRead, offset, received, length, block, request_bytes));
    }
    submission->ticket = next_ticket_++;
    *ticket = submission->ticket;
    stream_->Submit(std::move(submission));
    return 0;
  } catch (const std::bad_alloc&) {
    return Record(Status::Error(ENOMEM, "%s: out of memory planning %llu parameters", operation,
                                static_cast<unsigned long long>(count)));
  } catch (const std::system_error& e) {
    return Record(Status::Error(EAGAIN, "%s: cannot start the stream's thread: %s", operation, e.what()));
  }
}

int Model::SubmitPush(uint64_t first_param, const float* grad, uint64_t count, Ticket* ticket) {
  return Submit("submit_push", first_param, count, grad, nullptr, false, ticket);
}

int Model::SubmitPull(uint64_t first_param, float* weights, uint64_t count, Ticket* ticket) {
  return Submit("submit_pull", first_param, count, nullptr, weights, false, ticket);
}

int Model::SubmitExchange(uint64_t first_param, const float* grad, float* out, uint64_t count, Ticket* ticket) {
  return Submit("submit_exchange", first_param, count, grad, out, false, ticket);
}

int Model::SubmitPush16(uint64_t first_param, const uint16_t* grad, uint64_t count, Ticket* ticket) {
  return Submit("submit_push16", first_param, count, grad, nullptr, true, ticket);
}

int Model::SubmitPull16(uint64_t first_param, uint16_t* weights, uint64_t count, Ticket* ticket) {
  return Submit("submit_pull16", first_param, count, nullptr, weights, true, ticket);
}

int Model::SubmitExchange16(uint64_t first_param, const uint16_t* grad, uint16_t* out, uint64_t count, Ticket* ticket) {
  return Submit("submit_exchange16", first_param, count, grad, out, true, ticket);
}

int Model::Complete(std::vector<Completion>* out, size_t max, int timeout_ms) {
  if (stream_ == nullptr || max == 0) return 0;
  try {
    // Room first: once taken from the stream, a completion must not be lost.
    out->reserve(out->size() + std::min(max, stream_->outstanding()));
    std::vector<StreamCompletion> ended;
    ended.reserve(std::min(max, stream_->outstanding()));
    stream_->Complete(&ended, max, timeout_ms);
    for (StreamCompletion& c : ended) {
      out->push_back({c.ticket, -c.status.code(), c.status.message()});
    }
    return static_cast<int>(ended.size());
  } catch (const std::bad_alloc&) {
    return Record(Status::Error(ENOMEM, "complete: out of memory"));
  }
}

size_t Model::outstanding() const { return stream_ != nullptr ? stream_->outstanding() : 0; }

void Model::Wake() {
  if (stream_ != nullptr) stream_->Wake();
}

void Model::Settle() const {
  if (stream_ != nullptr) stream_->WaitIdle();
}

}  // namespace blkps
