// Specification of hashed tables (aggregator/hashed_table.h): rows keyed by
// any 64-bit id, made by pushes, a full table's refusal or eviction, probe
// lengths, memory that grows with the rows made, and a round trip of the
// rows made with their rule state.
#include "hashed_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <list>
#include <map>
#include <random>
#include <vector>

#include "blkps/feature_id.h"

namespace blkps::server {
namespace {

HashedTableOptions Options(uint64_t capacity, uint64_t width, const std::string& rule = "sgd") {
  HashedTableOptions o;
  o.capacity = capacity;
  o.width = width;
  o.rule.name = rule;
  o.rule.lr = 0.5f;
  o.init.kind = InitSpec::Kind::kNormal;
  o.init.scale = 0.1;
  o.init.seed = 11;
  return o;
}

std::unique_ptr<HashedTable> Make(const HashedTableOptions& o) {
  std::unique_ptr<HashedTable> t;
  Status s = HashedTable::Create(o, &t);
  EXPECT_TRUE(s.ok()) << s.message();
  return t;
}

std::vector<float> Read(const HashedTable& t, std::vector<uint64_t> ids) {
  std::vector<float> out(ids.size() * t.width());
  t.ReadRows(ids.data(), ids.size(), out.data());
  return out;
}

Status Push(HashedTable& t, std::vector<uint64_t> ids, float g) {
  std::vector<float> grads(ids.size() * t.width(), g);
  return t.PushRows(ids.data(), ids.size(), grads.data());
}

std::vector<float> Initial(const HashedTableOptions& o, uint64_t id) {
  std::vector<float> w(o.width);
  InitializeRow(o.init, id, w.data(), o.width);
  return w;
}

TEST(HashedTable, PullOfAnAbsentIdGivesItsInitialValuesAndMakesNoRow) {
  const HashedTableOptions o = Options(16, 4);
  auto t = Make(o);
  const uint64_t id = 0xfeedfacecafebeefull;
  EXPECT_EQ(Read(*t, {id}), Initial(o, id));
  EXPECT_EQ(t->RowsMade(), 0u);
}

TEST(HashedTable, PushMakesTheRowAndAppliesTheRuleToItsInitialValues) {
  const HashedTableOptions o = Options(16, 4);
  auto t = Make(o);
  const uint64_t id = uint64_t{1} << 63;
  ASSERT_TRUE(Push(*t, {id}, 1.0f).ok());
  std::vector<float> want = Initial(o, id);
  for (float& v : want) v -= 0.5f;
  EXPECT_EQ(Read(*t, {id}), want);
  EXPECT_EQ(t->RowsMade(), 1u);
}

TEST(HashedTable, AllZeroGradientMakesNoRow) {
  auto t = Make(Options(16, 4));
  ASSERT_TRUE(Push(*t, {7}, 0.0f).ok());
  EXPECT_EQ(t->RowsMade(), 0u);
}

TEST(HashedTable, RowsEqualADictionaryReferenceOverManyPushes) {
  const HashedTableOptions o = Options(5000, 3);
  auto t = Make(o);
  std::mt19937_64 rng(5);
  std::map<uint64_t, std::vector<float>> ref;
  for (int batch = 0; batch < 50; ++batch) {
    std::vector<uint64_t> ids(64);
    std::vector<float> grads(ids.size() * o.width);
    for (auto& id : ids) id = rng() % 4000 * 0x9e3779b97f4a7c15ull;  // repeats and spread bits
    for (auto& g : grads) g = static_cast<float>(rng() % 7) - 3.0f;
    ASSERT_TRUE(t->PushRows(ids.data(), ids.size(), grads.data()).ok());
    for (size_t k = 0; k < ids.size(); ++k) {
      const float* g = grads.data() + k * o.width;
      if (g[0] == 0 && g[1] == 0 && g[2] == 0) continue;
      auto it = ref.try_emplace(ids[k], Initial(o, ids[k])).first;
      for (uint64_t i = 0; i < o.width; ++i) it->second[i] -= 0.5f * g[i];
    }
  }
  EXPECT_EQ(t->RowsMade(), ref.size());
  for (const auto& [id, row] : ref) EXPECT_EQ(Read(*t, {id}), row) << id;
}

// Linear probing at load a: a successful lookup reads about (1 + 1/(1-a))/2
// slots (Knuth, TAOCP vol. 3, 6.4). At the table's most, half full: 1.5.
HashedTable::ProbeLengths FillWith(HashedTable& t, const std::vector<uint64_t>& ids) {
  for (size_t k = 0; k < ids.size(); k += 4096) {
    const size_t n = std::min<size_t>(4096, ids.size() - k);
    std::vector<float> g(n * t.width(), 1.0f);
    EXPECT_TRUE(t.PushRows(ids.data() + k, n, g.data()).ok());
  }
  EXPECT_EQ(t.RowsMade(), ids.size());
  return t.Probes();
}

constexpr uint64_t kHalfOfTwoToTheSeventeen = uint64_t{1} << 16;

TEST(HashedTable, ProbesOfRandomIdsStayNearTheTheoryWhenHalfFull) {
  auto t = Make(Options(kHalfOfTwoToTheSeventeen, 1));
  ASSERT_EQ(t->slot_count(), uint64_t{1} << 17);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> ids(kHalfOfTwoToTheSeventeen);
  for (auto& id : ids) id = rng();
  const HashedTable::ProbeLengths p = FillWith(*t, ids);
  ::testing::Test::RecordProperty("mean_probe", std::to_string(p.mean));
  ::testing::Test::RecordProperty("max_probe", std::to_string(p.max));
  EXPECT_LT(p.mean, 1.6);  // theory 1.5
  EXPECT_LE(p.max, 64u);
}

TEST(HashedTable, ProbesOfStructuredIdsAreAsShortAsRandomOnes) {
  auto t = Make(Options(kHalfOfTwoToTheSeventeen, 1));
  std::vector<uint64_t> ids(kHalfOfTwoToTheSeventeen);
  for (uint64_t k = 0; k < ids.size(); ++k) ids[k] = k << 20;  // all low bits equal
  const HashedTable::ProbeLengths p = FillWith(*t, ids);
  ::testing::Test::RecordProperty("mean_probe", std::to_string(p.mean));
  ::testing::Test::RecordProperty("max_probe", std::to_string(p.max));
  EXPECT_LT(p.mean, 1.6);
  EXPECT_LE(p.max, 64u);
}

TEST(HashedTable, FullTableWithoutEvictionRefusesAPushThatNeedsARowWhole) {
  const HashedTableOptions o = Options(4, 2);
  auto t = Make(o);
  ASSERT_TRUE(Push(*t, {1, 2, 3, 4}, 1.0f).ok());
  const std::vector<float> before = Read(*t, {1, 5});
  Status s = Push(*t, {1, 5}, 1.0f);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("hashed table full"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("evict="), std::string::npos) << s.message();
  EXPECT_EQ(Read(*t, {1, 5}), before);  // row 1 not pushed either
  EXPECT_EQ(t->RowsMade(), 4u);
  EXPECT_TRUE(Push(*t, {1, 2}, 1.0f).ok());  // rows it has still take pushes
}

TEST(HashedTable, LruPushEvictsTheLeastRecentlyPushedRow) {
  HashedTableOptions o = Options(3, 2);
  o.evict.kind = EvictionRule::Kind::kLeastRecentlyPushed;
  auto t = Make(o);
  ASSERT_TRUE(Push(*t, {10, 20, 30}, 1.0f).ok());
  ASSERT_TRUE(Push(*t, {10}, 1.0f).ok());  // 20 is now the least recently pushed
  ASSERT_TRUE(Push(*t, {40}, 1.0f).ok());
  EXPECT_EQ(t->Evictions(), 1u);
  EXPECT_EQ(Read(*t, {20}), Initial(o, 20));  // gone: its initial values again
  EXPECT_NE(Read(*t, {10}), Initial(o, 10));
  EXPECT_NE(Read(*t, {30}), Initial(o, 30));
  EXPECT_NE(Read(*t, {40}), Initial(o, 40));
  EXPECT_EQ(t->RowsMade(), 3u);
}

TEST(HashedTable, EvictionNeverTakesARowOfTheBatchBeingPushed) {
  HashedTableOptions o = Options(2, 1);
  o.evict.kind = EvictionRule::Kind::kLeastRecentlyPushed;
  auto t = Make(o);
  ASSERT_TRUE(Push(*t, {1, 2}, 1.0f).ok());
  ASSERT_TRUE(Push(*t, {1, 3}, 1.0f).ok());                     // 1 is the oldest but in the batch: 2 goes
  EXPECT_EQ(Read(*t, {1})[0], Initial(o, 1)[0] - 0.5f - 0.5f);  // pushed twice, kept
  EXPECT_EQ(Read(*t, {2}), Initial(o, 2));
  EXPECT_EQ(Push(*t, {1, 3, 4}, 1.0f).code(), Status::Code::kResourceExhausted);  // nothing evictable
}

TEST(HashedTable, AnEvictedIdComesBackWithFreshRuleState) {
  HashedTableOptions o = Options(1, 1, "adagrad");
  o.evict.kind = EvictionRule::Kind::kLeastRecentlyPushed;
  auto t = Make(o);
  ASSERT_TRUE(Push(*t, {1}, 1.0f).ok());
  const std::vector<float> first = Read(*t, {1});
  ASSERT_TRUE(Push(*t, {1}, 1.0f).ok());  // adagrad's sum of squares: 2
  ASSERT_TRUE(Push(*t, {2}, 1.0f).ok());  // evicts 1
  ASSERT_TRUE(Push(*t, {1}, 1.0f).ok());  // evicts 2; 1 starts over
  EXPECT_EQ(Read(*t, {1}), first);
}

TEST(HashedTable, IdleEvictsOnlyRowsNotPushedForNUpdates) {
  HashedTableOptions o = Options(2, 1);
  o.evict = {EvictionRule::Kind::kIdle, 3};
  auto t = Make(o);
  ASSERT_TRUE(Push(*t, {1, 2}, 1.0f).ok());  // updates 1, 2
  ASSERT_TRUE(Push(*t, {2}, 1.0f).ok());     // update 3: row 1 idle for 2
  Status s = Push(*t, {3}, 1.0f);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("idle:3"), std::string::npos) << s.message();
  ASSERT_TRUE(Push(*t, {2}, 1.0f).ok());  // update 4: row 1 idle for 3
  ASSERT_TRUE(Push(*t, {3}, 1.0f).ok());
  EXPECT_EQ(t->Evictions(), 1u);
  EXPECT_EQ(Read(*t, {1}), Initial(o, 1));
}

// Many evictions (backward-shift erases) against a reference of the same
// rule: every id the reference holds reads its row, every other id its
// initial values.
TEST(HashedTable, RowsEqualAnLruReferenceThroughManyEvictions) {
  HashedTableOptions o = Options(200, 1);
  o.evict.kind = EvictionRule::Kind::kLeastRecentlyPushed;
  auto t = Make(o);
  std::mt19937_64 rng(3);
  std::list<uint64_t> order;  // oldest first
  std::map<uint64_t, float> ref;
  for (int push = 0; push < 20000; ++push) {
    const uint64_t id = rng() % 600 * 0x10001;
    ASSERT_TRUE(Push(*t, {id}, 1.0f).ok());
    if (ref.count(id) == 0) {
      if (ref.size() == o.capacity) {
        ref.erase(order.front());
        order.pop_front();
      }
      ref[id] = Initial(o, id)[0];
    } else {
      order.remove(id);
    }
    order.push_back(id);
    ref[id] -= 0.5f;
  }
  for (uint64_t id = 0; id < 600 * 0x10001; id += 0x10001) {
    const float want = ref.count(id) != 0 ? ref[id] : Initial(o, id)[0];
    EXPECT_EQ(Read(*t, {id})[0], want) << id;
  }
}

TEST(HashedTable, MemoryBoundLimitsTheRowsMade) {
  HashedTableOptions o = Options(1000, 8);
  std::unique_ptr<UpdateRule> rule;
  ASSERT_TRUE(MakeUpdateRule(o.rule, 0, &rule).ok());
  o.memory_limit_bytes = HashedTable::SlotArrayBytes(1000) + 10 * HashedTable::RowBytes(8, *rule);
  auto t = Make(o);
  EXPECT_EQ(t->row_limit(), 10u);
  std::vector<uint64_t> ids(10);
  for (uint64_t k = 0; k < 10; ++k) ids[k] = k;
  ASSERT_TRUE(Push(*t, ids, 1.0f).ok());
  EXPECT_EQ(Push(*t, {99}, 1.0f).code(), Status::Code::kResourceExhausted);
}

TEST(HashedTable, MemoryBoundBelowTheSlotArrayIsRefusedAtCreation) {
  HashedTableOptions o = Options(1000, 8);
  o.memory_limit_bytes = HashedTable::SlotArrayBytes(1000);
  std::unique_ptr<HashedTable> t;
  Status s = HashedTable::Create(o, &t);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("memory="), std::string::npos) << s.message();
}

// The process's mapped memory (VmSize), in bytes.
uint64_t MappedBytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    uint64_t kib = 0;
    if (key == "VmSize:" && in >> kib) return kib * 1024;
  }
  return 0;
}

// A table of 10^8 possible rows held to 1,000 by memory= maps its slot
// array and those 1,000 rows, not 10^8 rows' weights and rule state.
TEST(HashedTable, MemoryBoundedTableMapsOnlyTheRowsItMayMake) {
  HashedTableOptions o = Options(100000000, 16, "adam");
  std::unique_ptr<UpdateRule> rule;
  ASSERT_TRUE(MakeUpdateRule(o.rule, 0, &rule).ok());
  const uint64_t row = HashedTable::RowBytes(16, *rule);
  o.memory_limit_bytes = HashedTable::SlotArrayBytes(o.capacity) + 1000 * row;
  const uint64_t before = MappedBytes();
  auto t = Make(o);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->row_limit(), 1000u);
  const uint64_t mapped = MappedBytes() - before;
  EXPECT_LE(mapped, o.memory_limit_bytes + (1 << 20)) << mapped << " bytes mapped";
}

// Issue 38: 10^6 rows made of 10^8 possible ids cost at most 1.5 times the
// rows and their rule state, by the table's own accounting.
TEST(HashedTable, AMillionRowsOfAHundredMillionIdsCostAtMostOneAndAHalfTimesTheirRows) {
  const uint64_t rows = 1000000, width = 32;
  auto t = Make(Options(rows, width, "adagrad"));
  std::mt19937_64 rng(1);
  std::vector<uint64_t> ids;
  std::vector<bool> taken(100000000);
  while (ids.size() < rows) {
    const uint64_t id = rng() % 100000000;
    if (!taken[id]) {
      taken[id] = true;
      ids.push_back(id);
    }
  }
  FillWith(*t, ids);
  const uint64_t payload = rows * width * (sizeof(float) + sizeof(float));  // weights + adagrad's sum
  EXPECT_LE(t->MemoryBytes(), payload * 3 / 2) << t->MemoryBytes() << " bytes for " << payload;
}

TEST(HashedTable, RestoredRowsContinueExactlyAsTheOriginal) {
  HashedTableOptions o = Options(50, 3, "adam");
  o.evict.kind = EvictionRule::Kind::kLeastRecentlyPushed;
  auto a = Make(o);
  std::mt19937_64 rng(9);
  auto batch = [&] {
    std::vector<uint64_t> ids(8);
    for (auto& id : ids) id = rng() % 80;
    return ids;
  };
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(Push(*a, batch(), 0.25f).ok());
  auto b = Make(o);
  ASSERT_TRUE(b->RestoreRows(a->Updates(), a->Evictions(), a->SaveRows()).ok());
  EXPECT_EQ(b->RowsMade(), a->RowsMade());
  for (int i = 0; i < 30; ++i) {  // adam's moments and the eviction order carry on alike
    const std::vector<uint64_t> ids = batch();
    ASSERT_TRUE(Push(*a, ids, 0.5f).ok());
    ASSERT_TRUE(Push(*b, ids, 0.5f).ok());
  }
  std::vector<uint64_t> all(80);
  for (uint64_t id = 0; id < 80; ++id) all[id] = id;
  EXPECT_EQ(Read(*b, all), Read(*a, all));
  EXPECT_EQ(b->Evictions(), a->Evictions());
}

TEST(HashedTable, RestoreOfARepeatedIdIsRefused) {
  auto a = Make(Options(4, 1));
  ASSERT_TRUE(Push(*a, {1}, 1.0f).ok());
  std::vector<HashedTable::Row> rows = a->SaveRows();
  rows.push_back(rows[0]);
  Status s = Make(Options(4, 1))->RestoreRows(1, 0, rows);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("repeats"), std::string::npos) << s.message();
}

TEST(HashedTableOptions, BadShapesAndAFileInitAreRefused) {
  std::unique_ptr<HashedTable> t;
  EXPECT_EQ(HashedTable::Create(Options(0, 4), &t).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(HashedTable::Create(Options(4, 0), &t).code(), Status::Code::kInvalidArgument);
  HashedTableOptions o = Options(4, 4);
  o.init.kind = InitSpec::Kind::kFile;
  EXPECT_EQ(HashedTable::Create(o, &t).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(t, nullptr);
}

TEST(EvictionRule, ParsesItsThreeForms) {
  EvictionRule r;
  ASSERT_TRUE(ParseEvictionRule("idle:100", &r).ok());
  EXPECT_EQ(r.kind, EvictionRule::Kind::kIdle);
  EXPECT_EQ(r.idle_updates, 100u);
  ASSERT_TRUE(ParseEvictionRule("lru-push", &r).ok());
  EXPECT_EQ(EvictionRuleText(r), "lru-push");
  ASSERT_TRUE(ParseEvictionRule("none", &r).ok());
  EXPECT_EQ(r.kind, EvictionRule::Kind::kNone);
}

TEST(EvictionRule, BadFormsAreRefusedNamingTheKey) {
  EvictionRule r;
  for (const char* bad : {"idle:0", "idle:", "idle:x", "lru", "idle:-1"}) {
    Status s = ParseEvictionRule(bad, &r);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_EQ(s.message().rfind("evict:", 0), 0u) << s.message();
  }
}

TEST(FeatureId, HashAndShardGiveTheContractsVectors) {
  EXPECT_EQ(blkps_feature_id_hash(0), 0u);
  EXPECT_EQ(blkps_feature_id_hash(1), 0x5692161d100b05e5u);
  EXPECT_EQ(blkps_feature_id_hash(12345), 0xf36cf1164265dd51u);
  EXPECT_EQ(blkps_feature_id_hash(UINT64_MAX), 0xb4d055fcf2cbbd7bu);
  EXPECT_EQ(blkps_feature_id_shard(2, 4), 3u);
  EXPECT_EQ(blkps_feature_id_shard(12345, 3), 2u);
  EXPECT_EQ(blkps_feature_id_shard(UINT64_MAX, 4), 2u);
}

TEST(FeatureId, ShardsSplitIdsEvenly) {
  uint64_t count[3] = {};
  for (uint64_t id = 0; id < 30000; ++id) ++count[blkps_feature_id_shard(id, 3)];
  for (uint64_t c : count) EXPECT_NEAR(static_cast<double>(c), 10000.0, 500.0);
}

}  // namespace
}  // namespace blkps::server
