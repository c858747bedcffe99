// Striping a model over shards, without a server: StripeMap's address
// translation as a property over random layouts, the layout file parser, and
// StripedDevice (layout:PATH) over regular files as shards.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "blkps/model.hpp"
#include "shard_layout.h"
#include "stripe_map.h"

namespace blkps {
namespace {

// Where model byte `offset` lives, straight from the definition: unit k on
// shard k mod S at shard byte (k div S) * unit.
StripePiece Locate(uint64_t unit, uint32_t shards, uint64_t offset) {
  const uint64_t k = offset / unit;
  return {static_cast<uint32_t>(k % shards), k / shards * unit + offset % unit, 1};
}

struct RandomLayout {
  uint64_t unit;
  uint32_t shards;
  uint64_t size;
};

RandomLayout MakeLayout(std::mt19937_64& rng) {
  RandomLayout layout;
  // Mostly sector multiples, as layouts have; sometimes any unit at all.
  layout.unit = rng() % 4 == 0 ? 1 + rng() % 3000 : 512 * (1 + rng() % 16);
  layout.shards = 1 + rng() % 8;
  // From less than one unit to a few dozen units, often a partial last one.
  layout.size = 1 + rng() % (layout.unit * (1 + rng() % 40));
  return layout;
}

TEST(StripeMapTest, PiecesCoverRandomRangesExactlyOnceInOrder) {
  std::mt19937_64 rng(20261121);
  for (int trial = 0; trial < 2000; ++trial) {
    const RandomLayout l = MakeLayout(rng);
    const StripeMap map(l.unit, l.shards, l.size);
    SCOPED_TRACE("unit " + std::to_string(l.unit) + " shards " + std::to_string(l.shards) + " size " +
                 std::to_string(l.size));
    for (int r = 0; r < 20; ++r) {
      const uint64_t offset = rng() % (l.size + 1);
      const uint64_t length = rng() % (l.size - offset + 1);
      std::vector<StripePiece> pieces;
      map.Map(offset, length, &pieces);
      uint64_t at = offset;  // model byte where the next piece must start
      for (const StripePiece& piece : pieces) {
        ASSERT_GT(piece.length, 0u);
        ASSERT_LT(piece.shard, l.shards);
        ASSERT_LE(piece.shard_offset + piece.length, map.ShardBytes(piece.shard));
        // Every unit the piece touches is where the definition puts it.
        for (uint64_t b = at; b < at + piece.length; b = (b / l.unit + 1) * l.unit) {
          const StripePiece want = Locate(l.unit, l.shards, b);
          ASSERT_EQ(piece.shard, want.shard) << "model byte " << b;
          ASSERT_EQ(piece.shard_offset + (b - at), want.shard_offset) << "model byte " << b;
        }
        at += piece.length;
      }
      ASSERT_EQ(at, offset + length);
    }
  }
}

TEST(StripeMapTest, RoundTripThroughShardBuffersEqualsAFlatModel) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const RandomLayout l = MakeLayout(rng);
    const StripeMap map(l.unit, l.shards, l.size);
    SCOPED_TRACE("unit " + std::to_string(l.unit) + " shards " + std::to_string(l.shards) + " size " +
                 std::to_string(l.size));
    // S shard buffers, each exactly its part of the model.
    std::vector<std::vector<uint8_t>> shard(l.shards);
    std::vector<std::vector<int>> writes(l.shards);
    uint64_t parts = 0;
    for (uint32_t s = 0; s < l.shards; ++s) {
      shard[s].assign(map.ShardBytes(s), 0);
      writes[s].assign(map.ShardBytes(s), 0);
      parts += map.ShardBytes(s);
    }
    ASSERT_EQ(parts, l.size);
    std::vector<uint8_t> flat(l.size);
    for (uint8_t& b : flat) b = static_cast<uint8_t>(rng());
    // Write the model in random ranges, as a learner would.
    std::vector<StripePiece> pieces;
    for (uint64_t offset = 0; offset < l.size;) {
      const uint64_t length = std::min<uint64_t>(l.size - offset, 1 + rng() % (3 * l.unit));
      pieces.clear();
      map.Map(offset, length, &pieces);
      uint64_t at = offset;
      for (const StripePiece& p : pieces) {
        memcpy(&shard[p.shard][p.shard_offset], &flat[at], p.length);
        for (uint64_t i = 0; i < p.length; ++i) {
          ++writes[p.shard][p.shard_offset + i];
        }
        at += p.length;
      }
      offset += length;
    }
    for (uint32_t s = 0; s < l.shards; ++s) {
      for (size_t i = 0; i < writes[s].size(); ++i) {
        ASSERT_EQ(writes[s][i], 1) << "shard " << s << " byte " << i;
      }
    }
    // Read random ranges back through the map: the flat model's bytes.
    for (int r = 0; r < 20; ++r) {
      const uint64_t offset = rng() % (l.size + 1);
      const uint64_t length = rng() % (l.size - offset + 1);
      std::vector<uint8_t> read(length);
      pieces.clear();
      map.Map(offset, length, &pieces);
      uint64_t at = 0;
      for (const StripePiece& p : pieces) {
        memcpy(&read[at], &shard[p.shard][p.shard_offset], p.length);
        at += p.length;
      }
      // (memcmp of an empty vector's null data is undefined: UBSan says so)
      ASSERT_TRUE(length == 0 || memcmp(read.data(), &flat[offset], length) == 0)
          << "range [" << offset << ", " << offset + length << ")";
    }
  }
}

TEST(StripeMapTest, UnitKLivesOnShardKModSAtUnitKDivS) {
  const uint64_t unit = 1 << 20;
  const StripeMap map(unit, 2, 5 * unit + 1000);  // 6 units, the last partial
  EXPECT_EQ(map.ShardBytes(0), 3 * unit);
  EXPECT_EQ(map.ShardBytes(1), 2 * unit + 1000);
  std::vector<StripePiece> pieces;
  map.Map(unit - 512, 3 * unit, &pieces);  // end of unit 0 .. into unit 3
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[0].shard, 0u);
  EXPECT_EQ(pieces[0].shard_offset, unit - 512);
  EXPECT_EQ(pieces[0].length, 512u);
  EXPECT_EQ(pieces[1].shard, 1u);  // unit 1
  EXPECT_EQ(pieces[1].shard_offset, 0u);
  EXPECT_EQ(pieces[1].length, unit);
  EXPECT_EQ(pieces[2].shard, 0u);  // unit 2
  EXPECT_EQ(pieces[2].shard_offset, unit);
  EXPECT_EQ(pieces[3].shard, 1u);  // unit 3, its first unit - 512 bytes
  EXPECT_EQ(pieces[3].shard_offset, unit);
  EXPECT_EQ(pieces[3].length, unit - 512);
}

TEST(StripeMapTest, OneShardIsOnePiece) {
  const StripeMap map(512, 1, 100000);
  std::vector<StripePiece> pieces;
  map.Map(100, 90000, &pieces);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].shard_offset, 100u);
  EXPECT_EQ(pieces[0].length, 90000u);
}

TEST(StripeMapTest, MoreShardsThanUnitsLeavesTheLastShardsEmpty) {
  const StripeMap map(4096, 4, 5000);  // 2 units
  EXPECT_EQ(map.ShardBytes(0), 4096u);
  EXPECT_EQ(map.ShardBytes(1), 5000u - 4096u);
  EXPECT_EQ(map.ShardBytes(2), 0u);
  EXPECT_EQ(map.ShardBytes(3), 0u);
}

// --- the layout file ---

TEST(ShardLayoutTest, ParsesUnitAndShardsInOrderWithComments) {
  ShardLayout layout;
  Status status = ParseShardLayout("# blkps shard layout\n"
                                   "\n"
                                   "stripe_unit = 1048576   # bytes\n"
                                   "shard = iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:a/1\n"
                                   "  shard=iscsi://127.0.0.1:3262/iqn.2026-11.io.blkps:b/1  \n",
                                   "model.layout", &layout);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(layout.stripe_unit, 1048576u);
  ASSERT_EQ(layout.shards.size(), 2u);
  EXPECT_EQ(layout.shards[0].target, "iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:a/1");
  EXPECT_EQ(layout.shards[0].line, 4);
  EXPECT_EQ(layout.shards[1].target, "iscsi://127.0.0.1:3262/iqn.2026-11.io.blkps:b/1");
  EXPECT_EQ(layout.shards[1].line, 5);
}

TEST(ShardLayoutTest, SixteenBitShardsHalveTheDeviceStripeUnit) {
  ShardLayout layout;
  ASSERT_TRUE(ParseShardLayout("stripe_unit = 4096\ndtype = float16\nshard = a\n", "m.layout", &layout).ok());
  EXPECT_EQ(layout.dtype, wire::Dtype::kFloat16);
  EXPECT_EQ(layout.device_stripe_unit(), 2048u);
  ASSERT_TRUE(ParseShardLayout("stripe_unit = 4096\nshard = a\n", "m.layout", &layout).ok());
  EXPECT_EQ(layout.device_stripe_unit(), 4096u);
}

TEST(ShardLayoutTest, ControlLinesNameEachShardsControlLunInShardOrder) {
  ShardLayout layout;
  Status status = ParseShardLayout("stripe_unit = 4096\nshard = a/1\nshard = b/1\ncontrol = a/2\ncontrol = b/2\n",
                                   "m.layout", &layout);
  ASSERT_TRUE(status.ok()) << status.message();
  ASSERT_EQ(layout.controls.size(), 2u);
  EXPECT_EQ(layout.controls[0].target, "a/2");
  EXPECT_EQ(layout.controls[1].target, "b/2");
  EXPECT_EQ(layout.controls[1].line, 5);
  ASSERT_TRUE(ParseShardLayout("stripe_unit = 4096\nshard = a/1\n", "m.layout", &layout).ok());
  EXPECT_TRUE(layout.controls.empty());
}

TEST(ShardLayoutTest, AHashedLayoutNamesShardsWithoutAStripeUnit) {
  ShardLayout layout;
  Status status =
      ParseShardLayout("kind = hashed\nshard = a/1\nshard = b/1\ncontrol = a/2\ncontrol = b/2\n", "m.layout", &layout);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(layout.kind, ShardLayout::Kind::kHashed);
  EXPECT_EQ(layout.stripe_unit, 0u);
  ASSERT_EQ(layout.shards.size(), 2u);
  EXPECT_EQ(layout.shards[1].target, "b/1");
  EXPECT_EQ(layout.controls.size(), 2u);
}

TEST(ShardLayoutTest, ALayoutWithoutAKindIsStriped) {
  ShardLayout layout;
  ASSERT_TRUE(ParseShardLayout("stripe_unit = 4096\nshard = a\n", "m.layout", &layout).ok());
  EXPECT_EQ(layout.kind, ShardLayout::Kind::kStriped);
  ASSERT_TRUE(ParseShardLayout("kind = striped\nstripe_unit = 4096\nshard = a\n", "m.layout", &layout).ok());
  EXPECT_EQ(layout.kind, ShardLayout::Kind::kStriped);
}

TEST(ShardLayoutTest, ReplicaLinesListAShardsBackupsAfterItsPrimary) {
  ShardLayout layout;
  Status status = ParseShardLayout("stripe_unit = 4096\n"
                                   "shard = iscsi://127.0.0.1:3261/iqn.2026-11.io.blkps:a/1\n"
                                   "replica = iscsi://127.0.0.1:3263/iqn.2026-11.io.blkps:a/1\n"
                                   "replica = iscsi://127.0.0.1:3265/iqn.2026-11.io.blkps:a/1\n"
                                   "shard = iscsi://127.0.0.1:3262/iqn.2026-11.io.blkps:b/1\n",
                                   "m.layout", &layout);
  ASSERT_TRUE(status.ok()) << status.message();
  ASSERT_EQ(layout.shards.size(), 2u);
  EXPECT_EQ(layout.shards[0].replicas, (std::vector<std::string>{"iscsi://127.0.0.1:3263/iqn.2026-11.io.blkps:a/1",
                                                                 "iscsi://127.0.0.1:3265/iqn.2026-11.io.blkps:a/1"}));
  EXPECT_TRUE(layout.shards[1].replicas.empty()) << "a shard without replica lines has its primary only";
}

// The message of parsing `text` as file "m.layout" (expected to fail).
std::string ParseError(const std::string& text) {
  ShardLayout layout;
  Status status = ParseShardLayout(text, "m.layout", &layout);
  EXPECT_FALSE(status.ok()) << text;
  EXPECT_EQ(status.code(), EINVAL);
  EXPECT_EQ(status.message().find('\n'), std::string::npos);
  return status.message();
}

TEST(ShardLayoutTest, AMalformedReplicaLineIsAOneLineError) {
  const std::string head = "stripe_unit = 4096\nshard = iscsi://h:1/iqn.x:a/1\n";
  EXPECT_EQ(ParseError("stripe_unit = 4096\nreplica = iscsi://h:2/iqn.x:a/1\nshard = iscsi://h:1/iqn.x:a/1\n"),
            "blkps: m.layout:2: replica before any shard line; put it under the shard it is a replica of");
  EXPECT_EQ(ParseError(head + "replica = iscsi://h:2/iqn.x:a/2\n"),
            "blkps: m.layout:3: replica: expected an iscsi:// URL of LUN 1, as its shard on line 2, got "
            "'iscsi://h:2/iqn.x:a/2'");
  EXPECT_EQ(ParseError(head + "replica = /dev/sdb\n"),
            "blkps: m.layout:3: replica: expected an iscsi:// URL of LUN 1, as its shard on line 2, got '/dev/sdb'");
  EXPECT_EQ(ParseError(head + "replica = iscsi://h:1/iqn.x:a/1\n"),
            "blkps: m.layout:3: replica iscsi://h:1/iqn.x:a/1 is named twice for the shard on line 2; name each "
            "replica once");
  EXPECT_EQ(ParseError("stripe_unit = 4096\nshard = a.bin\nreplica = iscsi://h:1/iqn.x:a/1\n"),
            "blkps: m.layout:3: replica of shard line 2, which is no iscsi:// or iser:// URL; only a LUN served over "
            "iSCSI has replicas");
}

TEST(ShardLayoutTest, ErrorsNameFileAndLine) {
  EXPECT_EQ(ParseError("stripe_unit = 512\nshard = a\nbogus = 1\n"),
            "blkps: m.layout:3: unknown key 'bogus'; expected kind, stripe_unit, "
            "dtype, shard, replica or control");
  EXPECT_EQ(ParseError("stripe_unit = 1024\ndtype = half\nshard = a\n"),
            "blkps: m.layout:2: dtype: expected one of float32, bfloat16, "
            "float16, got 'half'");
  EXPECT_EQ(ParseError("stripe_unit = 512\ndtype = bfloat16\nshard = a\n"),
            "blkps: m.layout:1: stripe_unit 512 over bfloat16 shards is 256 "
            "device bytes, not a multiple of 512; use a multiple of 1024");
  EXPECT_EQ(ParseError("stripe_unit = 1000\nshard = a\n"),
            "blkps: m.layout:1: stripe_unit: expected a number of bytes > 0 "
            "and a multiple of 512, got '1000'");
  EXPECT_EQ(ParseError("# x\nstripe_unit = 512\nshard a\n"),
            "blkps: m.layout:3: expected 'key = value', got 'shard a'");
  EXPECT_EQ(ParseError("stripe_unit = 512\nstripe_unit = 1024\nshard = a\n"),
            "blkps: m.layout:2: stripe_unit given twice (first on line 1)");
  EXPECT_EQ(ParseError("stripe_unit = 512\nshard = layout:/x\n"),
            "blkps: m.layout:2: shard 'layout:/x': a shard cannot be another "
            "layout");
  EXPECT_NE(ParseError("stripe_unit = 0\nshard = a\n").find("m.layout:1:"), std::string::npos);
  EXPECT_NE(ParseError("stripe_unit = -512\nshard = a\n").find("m.layout:1:"), std::string::npos);
  EXPECT_NE(ParseError("stripe_unit = 512\nshard =\n").find("m.layout:2:"), std::string::npos);
  EXPECT_EQ(ParseError("stripe_unit = 512\nshard = a\nshard = b\ncontrol = c\n"),
            "blkps: m.layout:4: 1 control lines for 2 shards; give one per shard, in shard order, or none");
  EXPECT_EQ(ParseError("stripe_unit = 512\nshard = a\ncontrol = layout:/x\n"),
            "blkps: m.layout:3: control: expected a shard's control LUN (iscsi:// or iser:// URL, or a path), got "
            "'layout:/x'");
  EXPECT_EQ(ParseError("shard = a\n"), "blkps: m.layout: no 'stripe_unit = <bytes>' line; a layout needs "
                                       "one");
  EXPECT_EQ(ParseError("stripe_unit = 512\n"), "blkps: m.layout: no 'shard = <target>' line; a layout needs at "
                                               "least one shard");
}

TEST(ShardLayoutTest, AHashedLayoutRefusesAStripeUnitADtypeAndAnUnknownKind) {
  EXPECT_EQ(ParseError("kind = hashed\nstripe_unit = 4096\nshard = a\n"),
            "blkps: m.layout:2: a kind = hashed layout has no stripe_unit: a hashed table's rows go to shards by "
            "their id's hash, as float32; remove the line");
  EXPECT_NE(ParseError("dtype = bfloat16\nkind = hashed\nshard = a\n")
                .find("m.layout:1: a kind = hashed layout "
                      "has no dtype"),
            std::string::npos);
  EXPECT_EQ(ParseError("kind = hash\nshard = a\n"), "blkps: m.layout:1: kind: expected striped or hashed, got 'hash'");
  EXPECT_EQ(ParseError("kind = hashed\nkind = hashed\nshard = a\n"),
            "blkps: m.layout:2: kind given twice (first on line 1)");
  EXPECT_EQ(ParseError("kind = hashed\n"), "blkps: m.layout: no 'shard = <target>' line; a layout needs at least "
                                           "one shard");
}

// --- StripedDevice over regular files, through the public API ---

class StripedFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/blkps-stripe-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& f : files_) unlink(f.c_str());
    rmdir(dir_.c_str());
  }

  // Creates file `name` in the test folder holding `bytes`.
  std::string WriteFile(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    files_.push_back(path);
    return path;
  }
  std::string ReadFile(const std::string& name) {
    std::ifstream in(dir_ + "/" + name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Three zeroed file shards (8, 8 and 4 KiB) striped in 4 KiB units: a
  // model of 5120 parameters.
  std::unique_ptr<Model> OpenThreeShards(std::string* error) {
    WriteFile("a", std::string(8192, '\0'));
    WriteFile("b", std::string(8192, '\0'));
    WriteFile("c", std::string(4096, '\0'));
    return Open(WriteFile("m.layout", "stripe_unit = 4096\nshard = a\nshard = b\nshard = c\n"), error);
  }

  std::unique_ptr<Model> Open(const std::string& layout, std::string* error) {
    OpenOptions options;
    options.request_bytes = 4096;  // several requests, each over both shards
    return Model::Open("layout:" + layout, options, error);
  }

  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(StripedFilesTest, BytesLandOnTheShardsTheLayoutSays) {
  // 2 shards, 1024-byte units, a model of 5 units and a half: shard 0 holds
  // units 0, 2, 4 (3072 bytes), shard 1 units 1, 3, 5 (2560 bytes).
  WriteFile("s0", std::string(3072, '\0'));
  WriteFile("s1", std::string(2560, '\0'));
  // Relative shard paths are relative to the layout file's folder.
  const std::string layout = WriteFile("m.layout", "stripe_unit = 1024\nshard = s0\nshard = s1\n");
  std::string error;
  auto model = Open(layout, &error);
  ASSERT_NE(model, nullptr) << error;
  ASSERT_EQ(model->size_bytes(), 5632u);
  std::string flat(5632, '\0');
  std::mt19937 rng(3);
  for (char& c : flat) c = static_cast<char>(rng());
  ASSERT_EQ(model->WriteBytes(0, flat.data(), flat.size()), 0) << model->last_error();
  std::string back(flat.size(), '\0');
  ASSERT_EQ(model->ReadBytes(512, &back[512], 4608), 0) << model->last_error();
  EXPECT_EQ(back.substr(512, 4608), flat.substr(512, 4608));
  model.reset();
  EXPECT_EQ(ReadFile("s0"), flat.substr(0, 1024) + flat.substr(2048, 1024) + flat.substr(4096, 1024));
  EXPECT_EQ(ReadFile("s1"), flat.substr(1024, 1024) + flat.substr(3072, 1024) + flat.substr(5120));
}

TEST_F(StripedFilesTest, PushAndPullOfParametersGoThroughTheStripes) {
  std::string error;
  auto model = OpenThreeShards(&error);
  ASSERT_NE(model, nullptr) << error;
  const uint64_t n = model->size_bytes() / 4;
  ASSERT_EQ(n, 5120u);
  std::vector<float> w(n);
  for (uint64_t i = 0; i < n; ++i) w[i] = static_cast<float>(i);
  ASSERT_EQ(model->Push(0, w.data(), n), 0) << model->last_error();
  std::vector<float> got(1500);
  ASSERT_EQ(model->Pull(1000, got.data(), got.size()), 0)  // not aligned
      << model->last_error();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 1000.0f + i);
  EXPECT_EQ(model->Sync(), 0) << model->last_error();
}

// An exchange over a layout splits its pushes and pulls alike per shard and
// pairs them (doc/libblkps.md "Exchange"); over files, which store what is
// written, each pulled range returns the push, in place too.
TEST_F(StripedFilesTest, ExchangeOverShardsPullsWhatItPushed) {
  std::string error;
  auto model = OpenThreeShards(&error);
  ASSERT_NE(model, nullptr) << error;
  std::vector<float> g(3500), out(3500, -1.0f);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.5f + static_cast<float>(i);
  ASSERT_EQ(model->Exchange(1000, g.data(), out.data(), g.size()), 0) << model->last_error();  // not aligned
  EXPECT_EQ(out, g);
  for (float& x : g) x = -x;
  const std::vector<float> sent = g;
  ASSERT_EQ(model->Exchange(1000, g.data(), g.data(), g.size()), 0) << model->last_error();
  EXPECT_EQ(g, sent);
  std::vector<float> w(3500);
  ASSERT_EQ(model->Pull(1000, w.data(), w.size()), 0) << model->last_error();
  EXPECT_EQ(w, sent);
}

TEST_F(StripedFilesTest, ShardOfTheWrongSizeIsRefusedWithTheSizeItNeeds) {
  // 5 units of 1 KiB over 3 shards: 2, 2 and 1 units. The layout names the
  // 1-unit file second, where 2 units belong.
  WriteFile("s0", std::string(2048, '\0'));
  WriteFile("s1", std::string(2048, '\0'));
  WriteFile("s2", std::string(1024, '\0'));
  const std::string layout = WriteFile("m.layout", "stripe_unit = 1024\nshard = s0\nshard = s2\nshard = s1\n");
  std::string error;
  EXPECT_EQ(Open(layout, &error), nullptr);
  EXPECT_NE(error.find("m.layout:3: shard 1 (" + dir_ +
                       "/s2) holds 1024 "
                       "bytes, but striping a model of 5120 bytes (the "
                       "shards' sum) in units "
                       "of 1024 bytes over 3 shards puts 2048 bytes on it"),
            std::string::npos)
      << error;
}

TEST_F(StripedFilesTest, MissingShardFailsNamingLayoutLineAndShard) {
  WriteFile("s0", std::string(1024, '\0'));
  const std::string layout = WriteFile("m.layout", "stripe_unit = 1024\nshard = s0\n\nshard = gone\n");
  std::string error;
  int code = 0;
  EXPECT_EQ(Model::Open("layout:" + layout, OpenOptions(), &error, &code), nullptr);
  EXPECT_EQ(code, -ENOENT);
  EXPECT_EQ(error.rfind("blkps: " + layout + ":4: shard 1 (" + dir_ + "/gone): ", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos);
}

TEST_F(StripedFilesTest, UnreachableShardFailsNamingIt) {
  WriteFile("s0", std::string(1024, '\0'));
  // Port 1 on loopback: nothing listens there, the connection is refused.
  const std::string url = "iscsi://127.0.0.1:1/iqn.2026-11.io.blkps:gone/1";
  const std::string layout = WriteFile("m.layout", "stripe_unit = 1024\nshard = s0\nshard = " + url + "\n");
  std::string error;
  EXPECT_EQ(Model::Open("layout:" + layout, OpenOptions(), &error), nullptr);
  EXPECT_EQ(error.rfind("blkps: " + layout + ":3: shard 1 (" + url + "): ", 0), 0u) << error;
}

TEST_F(StripedFilesTest, MissingLayoutFileSaysSo) {
  std::string error;
  int code = 0;
  EXPECT_EQ(Model::Open("layout:" + dir_ + "/none.layout", OpenOptions(), &error, &code), nullptr);
  EXPECT_EQ(code, -ENOENT);
  EXPECT_EQ(error, "blkps: cannot open layout file " + dir_ + "/none.layout: No such file or directory");
}

}  // namespace
}  // namespace blkps
