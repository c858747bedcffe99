// Specification of the --bsopts parser.
#include "lu_options.h"

#include <gtest/gtest.h>

namespace blkps::server {
namespace {

std::string ErrorOf(const std::string& bsopts) {
  LuOptions o;
  Status s = ParseLuOptions(bsopts, &o);
  EXPECT_FALSE(s.ok()) << bsopts;
  return s.message();
}

TEST(LuOptions, ParsesEveryKey) {
  LuOptions o;
  Status s = ParseLuOptions("params=1000;block=256K;rule=sgd;lr=0.5;init=normal:0.01;seed=9", &o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(o.job.model.num_params, 1000u);
  EXPECT_EQ(o.job.model.block_bytes, 256u * 1024);
  EXPECT_EQ(o.job.model.rule.name, "sgd");
  EXPECT_FLOAT_EQ(o.job.model.rule.lr, 0.5f);
  EXPECT_EQ(o.job.model.init.kind, InitSpec::Kind::kNormal);
  EXPECT_DOUBLE_EQ(o.job.model.init.scale, 0.01);
  EXPECT_EQ(o.job.model.init.seed, 9u);
  ASSERT_TRUE(ParseLuOptions("params=1000;memory=2G", &o).ok());
  EXPECT_EQ(o.job.model.memory_limit_bytes, uint64_t{2} << 30);
}

TEST(LuOptions, RuleParametersGoToTheirRule) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("params=10;rule=momentum;momentum=0.5;nesterov=1", &o).ok());
  EXPECT_FLOAT_EQ(o.job.model.rule.momentum, 0.5f);
  EXPECT_TRUE(o.job.model.rule.nesterov);
  ASSERT_TRUE(ParseLuOptions("params=10;eps=1e-6;rule=adam;beta1=0.8;beta2=0.99", &o).ok());
  EXPECT_FLOAT_EQ(o.job.model.rule.eps, 1e-6f);
  EXPECT_FLOAT_EQ(o.job.model.rule.beta1, 0.8f);
  EXPECT_FLOAT_EQ(o.job.model.rule.beta2, 0.99f);
  ASSERT_TRUE(ParseLuOptions("params=10;eps=1e-3;rule=adagrad", &o).ok());
  EXPECT_FLOAT_EQ(o.job.model.rule.adagrad_eps, 1e-3f);
  EXPECT_FLOAT_EQ(o.job.model.rule.eps, RuleOptions().eps);
}

TEST(LuOptions, ReplicaOptionsTakeAnIpv4AddressAndAnAsyncDenseModel) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("params=10;backup=127.0.0.1:3270", &o).ok());
  EXPECT_EQ(o.backup_at, "127.0.0.1:3270");
  EXPECT_TRUE(o.job.backup);
  ASSERT_TRUE(ParseLuOptions("params=10;replicate_to=10.0.0.2:3270", &o).ok());
  EXPECT_EQ(o.replicate_to, "10.0.0.2:3270");
  EXPECT_EQ(ErrorOf("params=10;backup=localhost:3270").rfind("backup: expected HOST:PORT", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;replicate_to=127.0.0.1:0").rfind("replicate_to: expected HOST:PORT", 0), 0u);
  ASSERT_TRUE(ParseLuOptions("params=10;mode=bsp;replicate_to=127.0.0.1:1", &o).ok());
  ASSERT_TRUE(ParseLuOptions("params=10;mode=ssp:2;backup=127.0.0.1:1", &o).ok());
  EXPECT_EQ(ErrorOf("table=10:4;staleness_aware=0;backup=127.0.0.1:1"),
            "backup: replicas serve dense models only for now, not tables");
  EXPECT_EQ(ErrorOf("params=10;backup=127.0.0.1:1;replicate_to=127.0.0.1:2"),
            "backup: a server is a primary (replicate_to=) or a backup (backup=), not both");
}

TEST(LuOptions, StalenessAwarenessIsOnByDefaultAndCanBeTurnedOff) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("params=10", &o).ok());
  EXPECT_TRUE(o.job.staleness_aware);
  EXPECT_EQ(o.job.stale_bound, JobOptions().stale_bound);
  ASSERT_TRUE(ParseLuOptions("params=10;staleness_aware=0;stale_bound=7", &o).ok());
  EXPECT_FALSE(o.job.staleness_aware);
  EXPECT_EQ(o.job.stale_bound, 7u);
  EXPECT_EQ(ErrorOf("params=10;staleness_aware=yes").rfind("staleness_aware:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;stale_bound=-1").rfind("stale_bound:", 0), 0u);
}

TEST(LuOptions, DefaultsNeedOnlyParams) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("params=10;", &o).ok());
  EXPECT_EQ(o.job.model.block_bytes, kDefaultBlockBytes);
  EXPECT_EQ(o.job.model.rule.name, "sgd");
  EXPECT_EQ(o.job.model.init.kind, InitSpec::Kind::kZeros);
}

TEST(LuOptions, ErrorsNameTheKey) {
  EXPECT_EQ(ErrorOf("").rfind("params: required", 0), 0u);
  EXPECT_EQ(ErrorOf("params=0").rfind("params:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=-5").rfind("params:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=12x").rfind("params:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;lr=abc").rfind("lr:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;lr=-1").rfind("lr:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;lr=nan").rfind("lr:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;block=6").rfind("block:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;block=1T").rfind("block:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;memory=0").rfind("memory:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;memory=lots").rfind("memory:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;init=gauss").rfind("init:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;init=uniform:0").rfind("init:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;seed=x").rfind("seed:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;colour=red").rfind("colour: unknown option", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;params=11").rfind("params: given more than once", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;lr").rfind("bsopts: expected key=value", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;nesterov=yes").rfind("nesterov:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;beta1=inf").rfind("beta1:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;mode=ssp").rfind("mode:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;mode=ssp:-1").rfind("mode:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;mode=sync").rfind("mode:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;dead_after=0").rfind("dead_after:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;hold_limit=30").rfind("hold_limit:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;max_dead=x").rfind("max_dead:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;checkpoint=rel/path").rfind("checkpoint:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;checkpoint_every=5").rfind("checkpoint_every:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;checkpoint_memory=64M").rfind("checkpoint_memory:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;checkpoint=/tmp/m.ckpt;checkpoint_memory=0").rfind("checkpoint_memory:", 0), 0u);
  EXPECT_EQ(ErrorOf("params=10;role=learner").rfind("role:", 0), 0u);
  EXPECT_EQ(ErrorOf("role=control;params=10").rfind("role:", 0), 0u);
}

TEST(LuOptions, ServerSemanticsKeys) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("params=10;mode=ssp:3;dead_after=2.5;hold_limit=5;max_dead=2;"
                             "checkpoint=/tmp/m.ckpt;checkpoint_every=60;checkpoint_memory=64M",
                             &o)
                  .ok());
  EXPECT_EQ(o.job.consistency.mode, ConsistencyMode::kSsp);
  EXPECT_EQ(o.job.consistency.staleness, 3u);
  EXPECT_DOUBLE_EQ(o.job.dead_after_s, 2.5);
  EXPECT_DOUBLE_EQ(o.job.hold_limit_s, 5);
  EXPECT_EQ(o.job.max_dead, 2u);
  EXPECT_EQ(o.job.checkpoint, "/tmp/m.ckpt");
  EXPECT_DOUBLE_EQ(o.job.checkpoint_every_s, 60);
  EXPECT_EQ(o.job.model.snapshot_copy_limit_bytes, 64u << 20);
  EXPECT_FALSE(o.control);
  ASSERT_TRUE(ParseLuOptions("mode=bsp;params=10", &o).ok());
  EXPECT_EQ(o.job.consistency.mode, ConsistencyMode::kBsp);
}

TEST(LuOptions, DtypeIsPerLunAndNotPartOfTheModel) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("params=10;lr=0.5", &o).ok());
  EXPECT_EQ(o.dtype, wire::Dtype::kFloat32);
  const std::string model = o.model_bsopts;
  EXPECT_EQ(model, "params=10;lr=0.5");
  for (const char* t : {"bfloat16", "float16", "float32"}) {
    ASSERT_TRUE(ParseLuOptions(std::string("params=10;dtype=") + t + ";lr=0.5", &o).ok()) << t;
    EXPECT_STREQ(wire::DtypeName(o.dtype), t);
    EXPECT_EQ(o.model_bsopts, model) << t;
  }
  EXPECT_EQ(ErrorOf("params=10;dtype=fp16"), "dtype: expected one of float32, bfloat16, float16, got 'fp16'");
  EXPECT_EQ(ErrorOf("role=control;dtype=bfloat16").rfind("role:", 0), 0u);
}

TEST(LuOptions, ControlLunTakesOnlyItsRoleAndAccess) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("role=control", &o).ok());
  EXPECT_TRUE(o.control);
  EXPECT_FALSE(o.learners_access);
  ASSERT_TRUE(ParseLuOptions("role=control;access=learners", &o).ok());
  EXPECT_TRUE(o.learners_access);
  EXPECT_EQ(ErrorOf("params=10;access=learners"), "access: only for the control LUN (role=control;access=learners)");
  EXPECT_EQ(ErrorOf("role=control;access=operators"), "access: expected learners, got 'operators'");
  // D3: a name proves nothing; the option that trusted one is refused.
  EXPECT_EQ(ErrorOf("role=control;operators=iqn.2026-11.io.blkps:op").rfind("operators: no longer taken", 0), 0u);
}

// tgtadm cuts --bsopts at the first ',': "params=1000,lr=0.1" would reach the
// plugin as "params=1000" and lr would be silently dropped.
TEST(LuOptions, RefusesACommaWithTheReasonFirst) {
  const std::string message = ErrorOf("params=1000,lr=0.1");
  EXPECT_EQ(message.rfind("',' is not an option separator", 0), 0u) << message;
  EXPECT_NE(message.find("separate options with ';'"), std::string::npos) << message;
  LuOptionPairs pairs;
  EXPECT_FALSE(SplitLuOptions("params=1000,lr=0.1", &pairs).ok());
}

TEST(LuOptions, SplitKeepsPairsInOrderAndVerbatim) {
  LuOptionPairs pairs;
  ASSERT_TRUE(SplitLuOptions("params=10;;init=file:/a=b;lr=x", &pairs).ok());
  const LuOptionPairs want = {{"params", "10"}, {"init", "file:/a=b"}, {"lr", "x"}};
  EXPECT_EQ(pairs, want);
  EXPECT_FALSE(SplitLuOptions("lr=1;lr=2", &pairs).ok());
  EXPECT_FALSE(SplitLuOptions("params", &pairs).ok());
}

// Found by tests/fuzz/bsopts_fuzz: a newline inside a key came back in the
// error message, which tgtd logs as one line.
TEST(LuOptions, ControlCharactersAreRefusedInOneLine) {
  const std::string message = ErrorOf("params=10;dead_\n\nafter=5");
  EXPECT_EQ(message, "bsopts: control character 0x0a at byte 15; --bsopts is one line of key=value;key=value");
  EXPECT_EQ(ErrorOf(std::string("params=10;lr=0.1\0", 17)).rfind("bsopts: control character 0x00 at byte 16", 0), 0u);
}

TEST(LuOptions, PartsNeedBspAndWholeBlocks) {
  LuOptions o;
  ASSERT_TRUE(ParseLuOptions("params=1000;block=1K;mode=bsp;parts=256:512:2", &o).ok());
  EXPECT_EQ(o.job.parts.first, 256u);
  EXPECT_EQ(o.job.parts.count, 512u);
  EXPECT_EQ(o.job.parts.k, 2u);
  EXPECT_EQ(ErrorOf("params=1000;block=1K;parts=256:512:2").rfind("parts: only with mode=bsp", 0), 0u);
  EXPECT_EQ(ErrorOf("params=1000;block=1K;mode=bsp;parts=100:512:2").rfind("parts: 100:512:2 does not start", 0), 0u);
}

}  // namespace
}  // namespace blkps::server
