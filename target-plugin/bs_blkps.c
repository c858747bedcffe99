/*
 * bs_blkps: tgt backing store "blkps". A LUN of this type is a window onto a
 * blkps model: a learner slot (READ returns weights, WRITE applies a
 * gradient) or the model's control LUN (lu.h). SYNCHRONIZE CACHE writes a
 * checkpoint.
 *
 *   tgtadm --op new --mode logicalunit --tid 1 --lun 1 --bstype blkps \
 *          --backing-store <model-name> --bsopts "params=1000000;lr=0.01"
 *
 * This file is the thin C shim over tgt (whose headers do not compile as
 * C++); the model and the options live in the C++ core behind lu.h.
 *
 * Commands run on tgt's bs_thread worker pool, not on tgtd's main thread:
 * bs_blkps_request() may take a model block lock. The exception is a
 * table's row-sized command (blkps_lu_runs_inline), which runs on the main
 * thread in bs_blkps_cmd_submit(). Before that, on the main
 * thread, bs_blkps_cmd_submit() asks the core whether a READ or WRITE may run
 * (bsp/ssp): if not, the core keeps the command (set_cmd_async) and later
 * releases it through the LU's eventfd, whose handler, again on the main
 * thread, passes it to the workers or fails it. Errors become SCSI sense
 * data and one line in tgtd's log, never a crash of the daemon.
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "list.h"
#include "util.h"
#include "tgtd.h"
#include "scsi.h"
#include "bs_thread.h"
#include "target.h"

#include "lu.h"
#include "blkps/control_lun.h"

#define BLKPS_ERRLEN 512

/* Per-LU private area tgt allocates after struct scsi_lu: the worker pool
 * first (BS_THREAD_I expects it there), then our core. */
struct bs_blkps_info {
	struct bs_thread_info threads;
	struct blkps_lu *core;
	int wake_fd;	/* eventfd: the core released held commands */
	/* Main thread: inline commands refused, completed from wake_fd's
	 * handler (their bs_list links them: they never reach the workers). */
	struct list_head refused_inline;
};

static struct bs_blkps_info *BS_BLKPS_I(struct scsi_lu *lu)
{
	return (struct bs_blkps_info *)BS_THREAD_I(lu);
}

/* SPC-4's INSUFFICIENT RESOURCES, which tgt's scsi.h does not name. */
#define BLKPS_ASC_INSUFFICIENT_RESOURCES 0x5503
/* SPC-4's LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE: a
 * backup not promoted (doc/replicas.md); path-failover initiators take it
 * as "use another path". */
#define BLKPS_ASC_PORT_IN_STANDBY 0x040b

static void set_sense(struct scsi_cmd *cmd, uint8_t key, uint16_t asc)
{
	scsi_set_result(cmd, SAM_STAT_CHECK_CONDITION);
	sense_data_build(cmd, key, asc);
}

static void complete_io(struct scsi_cmd *cmd, enum blkps_io_result r,
			const char *what, const char *err)
{
	switch (r) {
	case BLKPS_IO_OK:
		scsi_set_result(cmd, SAM_STAT_GOOD);
		return;
	case BLKPS_IO_OUT_OF_RANGE:
		set_sense(cmd, ILLEGAL_REQUEST, ASC_LBA_OUT_OF_RANGE);
		break;
	case BLKPS_IO_BAD_DATA:
		set_sense(cmd, ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_PARMS);
		break;
	case BLKPS_IO_NOT_READY:
		set_sense(cmd, NOT_READY, ASC_MEDIUM_NOT_PRESENT);
		err = "no model is open on this LUN";
		break;
	case BLKPS_IO_HOLD_TIMEOUT:
		set_sense(cmd, ABORTED_COMMAND,
			  ASC_INSUFFICIENT_TIME_FOR_OPERATION);
		break;
	case BLKPS_IO_JOB_FAILED:
		set_sense(cmd, NOT_READY, ASC_MANUAL_INTERVENTION_REQ);
		break;
	case BLKPS_IO_WRITE_PROTECT:
		set_sense(cmd, DATA_PROTECT, ASC_WRITE_PROTECT);
		break;
	case BLKPS_IO_CHECKPOINT_FAILED:
		set_sense(cmd, MEDIUM_ERROR, ASC_WRITE_ERROR);
		break;
	case BLKPS_IO_TABLE_FULL:
		set_sense(cmd, ILLEGAL_REQUEST, BLKPS_ASC_INSUFFICIENT_RESOURCES);
		break;
	case BLKPS_IO_WINDOWS_ONLY:
		set_sense(cmd, ILLEGAL_REQUEST, ASC_INVALID_OP_CODE);
		break;
	case BLKPS_IO_STANDBY:
		set_sense(cmd, NOT_READY, BLKPS_ASC_PORT_IN_STANDBY);
		break;
	}
	eprintf("blkps: lun %" PRIu64 " %s at byte %" PRIu64 ": %s\n",
		cmd->dev->lun, what, cmd->offset, err);
}

static int is_read(struct scsi_cmd *cmd)
{
	switch (cmd->scb[0]) {
	case READ_6:
	case READ_10:
	case READ_12:
	case READ_16:
		return 1;
	}
	return 0;
}

static int is_write(struct scsi_cmd *cmd)
{
	switch (cmd->scb[0]) {
	case WRITE_6:
	case WRITE_10:
	case WRITE_12:
	case WRITE_16:
		return 1;
	}
	return 0;
}

static const char *io_name(struct scsi_cmd *cmd)
{
	return is_read(cmd) ? "read" : is_write(cmd) ? "write" :
		"synchronize cache";
}

/* Runs on a bs_thread worker (or the main thread: blkps_lu_runs_inline). */
static void bs_blkps_request(struct scsi_cmd *cmd)
{
	struct blkps_lu *core = BS_BLKPS_I(cmd->dev)->core;
	char err[BLKPS_ERRLEN] = "";
	enum blkps_io_result r;

	switch (cmd->scb[0]) {
	case READ_6:
	case READ_10:
	case READ_12:
	case READ_16:
		r = blkps_lu_read(core, cmd->offset, scsi_get_in_buffer(cmd),
				  scsi_get_in_length(cmd), cmd, err, sizeof(err));
		complete_io(cmd, r, io_name(cmd), err);
		break;
	case WRITE_6:
	case WRITE_10:
	case WRITE_12:
	case WRITE_16:
		r = blkps_lu_write(core, cmd->offset, scsi_get_out_buffer(cmd),
				   scsi_get_out_length(cmd), cmd, err,
				   sizeof(err));
		complete_io(cmd, r, io_name(cmd), err);
		break;
	case SYNCHRONIZE_CACHE:
	case SYNCHRONIZE_CACHE_16:
		r = blkps_lu_sync(core, err, sizeof(err));
		complete_io(cmd, r, io_name(cmd), err);
		break;
	default:
		/* The opcode map below keeps other commands away from us. */
		set_sense(cmd, ILLEGAL_REQUEST, ASC_INVALID_OP_CODE);
		break;
	}
}

/*
 * Main thread: tgt's sbc_rw() reports GOOD for a command its store completed
 * on return, whatever sense the store set, so an inline command the core
 * refused completes later, from the wake handler, as a held one does.
 */
static void refuse_inline(struct scsi_cmd *cmd)
{
	struct bs_blkps_info *info = BS_BLKPS_I(cmd->dev);
	uint64_t one = 1;

	set_cmd_async(cmd);
	list_add_tail(&cmd->bs_list, &info->refused_inline);
	if (write(info->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		eprintf("blkps: lun %" PRIu64 " wake: %m\n", cmd->dev->lun);
}

/* Main thread: an asynchronous command that failed, its sense set, ends. */
static void finish_failed(struct scsi_cmd *cmd)
{
	scsi_set_in_resid_by_actual(cmd, 0);
	target_cmd_io_done(cmd, scsi_get_result(cmd));
}

/* Main thread: completes the refused inline commands of `info`. */
static void complete_refused_inline(struct bs_blkps_info *info)
{
	struct scsi_cmd *cmd;

	while (!list_empty(&info->refused_inline)) {
		cmd = list_first_entry(&info->refused_inline, struct scsi_cmd,
				       bs_list);
		list_del(&cmd->bs_list);
		finish_failed(cmd);
	}
}

/* Main thread: READ and WRITE pass the core's consistency gate first. */
static int bs_blkps_cmd_submit(struct scsi_cmd *cmd)
{
	struct blkps_lu *core = BS_BLKPS_I(cmd->dev)->core;
	int write = is_write(cmd);
	uint64_t len = write ? scsi_get_out_length(cmd) :
			       scsi_get_in_length(cmd);

	if ((write || is_read(cmd)) &&
	    blkps_lu_admit(core, write, cmd->offset, len, cmd,
			   cmd->it_nexus ? cmd->it_nexus->info : NULL)) {
		set_cmd_async(cmd);
		return 0;
	}
	if ((write || is_read(cmd)) && blkps_lu_runs_inline(core, len)) {
		/* Done on return, as tgt's null store is (lu.h). */
		bs_blkps_request(cmd);
		if (scsi_get_result(cmd) != SAM_STAT_GOOD)
			refuse_inline(cmd);
		return 0;
	}
	return bs_thread_cmd_submit(cmd);
}

/* Main thread: the core released held commands of this LU. */
static void bs_blkps_released(int fd, int events, void *data)
{
	struct scsi_lu *lu = data;
	struct blkps_lu *core = BS_BLKPS_I(lu)->core;
	char err[BLKPS_ERRLEN];
	enum blkps_io_result r;
	struct scsi_cmd *cmd;
	uint64_t count;

	if (read(fd, &count, sizeof(count)) < 0 && errno != EAGAIN)
		eprintf("blkps: lun %" PRIu64 " wake: %m\n", lu->lun);
	complete_refused_inline(BS_BLKPS_I(lu));
	while ((cmd = blkps_lu_take_released(core, &r, err, sizeof(err)))) {
		if (r == BLKPS_IO_OK) {
			bs_thread_cmd_submit(cmd);
			continue;
		}
		complete_io(cmd, r, io_name(cmd), err);
		finish_failed(cmd);
	}
}

/*
 * MODE SENSE guard. tgt 1.0.85's sbc_mode_sense() sets the device-specific
 * byte of the mode parameter header (byte 2 of MODE SENSE(6)'s data, byte 3
 * of MODE SENSE(10)'s) without checking the allocation length: a shorter one
 * wrote past the data-in buffer, and 0 (no buffer at all) crashed tgtd
 * (found by tests/fuzz/live_cdb_fuzz). Each blkps LU has its own copy of
 * tgt's opcode table, and its MODE SENSE entries point here: allocation
 * length 0 transfers nothing (GOOD, as SPC-4 says), 1 up to that byte is
 * refused (ILLEGAL REQUEST, INVALID FIELD IN CDB), anything longer goes to
 * tgt's handler.
 */
static int (*tgt_mode_sense)(int host_no, struct scsi_cmd *cmd);

static int bs_blkps_mode_sense(int host_no, struct scsi_cmd *cmd)
{
	int mode6 = cmd->scb[0] == MODE_SENSE;
	uint32_t alloc_len = mode6 ? cmd->scb[4] :
				     get_unaligned_be16(&cmd->scb[7]);

	if (alloc_len == 0) {
		scsi_set_in_resid_by_actual(cmd, 0);
		return SAM_STAT_GOOD;
	}
	if (alloc_len <= (mode6 ? 2u : 3u)) {
		set_sense(cmd, ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_CDB);
		return SAM_STAT_CHECK_CONDITION;
	}
	return tgt_mode_sense(host_no, cmd);
}

static void guard_mode_sense(struct scsi_lu *lu)
{
	struct device_type_operations *ops = lu->dev_type_template.ops;

	if (ops[MODE_SENSE].cmd_perform != bs_blkps_mode_sense)
		tgt_mode_sense = ops[MODE_SENSE].cmd_perform;
	ops[MODE_SENSE].cmd_perform = bs_blkps_mode_sense;
	ops[MODE_SENSE_10].cmd_perform = bs_blkps_mode_sense;
}

static tgtadm_err bs_blkps_init(struct scsi_lu *lu, char *bsopts)
{
	struct bs_blkps_info *info = BS_BLKPS_I(lu);
	char err[BLKPS_ERRLEN] = "";
	tgtadm_err ret;

	info->wake_fd = -1;
	INIT_LIST_HEAD(&info->refused_inline);
	guard_mode_sense(lu);
	info->core = blkps_lu_create(bsopts, err, sizeof(err));
	if (!info->core) {
		/* The reason first: a user reads the log's last line. */
		eprintf("blkps: %s (--bsopts '%s')\n", err,
			bsopts ? bsopts : "");
		return TGTADM_INVALID_REQUEST;
	}
	info->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (info->wake_fd < 0 ||
	    tgt_event_add(info->wake_fd, EPOLLIN, bs_blkps_released, lu)) {
		eprintf("blkps: cannot set up the LU's eventfd: %m\n");
		ret = TGTADM_NOMEM;
		goto fail;
	}
	ret = bs_thread_open(&info->threads, bs_blkps_request, nr_iothreads);
	if (ret == TGTADM_SUCCESS)
		return ret;
	tgt_event_del(info->wake_fd);
fail:
	if (info->wake_fd >= 0)
		close(info->wake_fd);
	info->wake_fd = -1;
	blkps_lu_destroy(info->core);
	info->core = NULL;
	return ret;
}

static void bs_blkps_exit(struct scsi_lu *lu)
{
	struct bs_blkps_info *info = BS_BLKPS_I(lu);

	bs_thread_close(&info->threads);
	complete_refused_inline(info);	/* none: tgt deletes an idle LU */
	tgt_event_del(info->wake_fd);
	close(info->wake_fd);
	blkps_lu_destroy(info->core);
	info->core = NULL;
}

static int bs_blkps_open(struct scsi_lu *lu, char *path, int *fd,
			 uint64_t *size)
{
	char err[BLKPS_ERRLEN] = "";

	if (blkps_lu_open(BS_BLKPS_I(lu)->core, path, lu->lun,
			  BS_BLKPS_I(lu)->wake_fd, size, err, sizeof(err))) {
		eprintf("blkps: %s (model '%s')\n", err, path);
		return -1;
	}
	*fd = -1;
	/* Learners find the control LUN by this (blkps/control_lun.h). */
	if (blkps_lu_is_control(BS_BLKPS_I(lu)->core))
		snprintf(lu->attrs.product_id, sizeof(lu->attrs.product_id),
			 "%s", BLKPS_CONTROL_PRODUCT_ID);
	return 0;
}

static void bs_blkps_close(struct scsi_lu *lu)
{
	blkps_lu_close(BS_BLKPS_I(lu)->core);
}

static struct backingstore_template blkps_bst = {
	.bs_name	= "blkps",
	.bs_datasize	= sizeof(struct bs_blkps_info),
	.bs_open	= bs_blkps_open,
	.bs_close	= bs_blkps_close,
	.bs_init	= bs_blkps_init,
	.bs_exit	= bs_blkps_exit,
	.bs_cmd_submit	= bs_blkps_cmd_submit,
};

/*
 * Registration happens exactly once on either path tgtd may load us:
 *   - installed in tgt's backing-store folder: tgtd dlopens the file (which
 *     runs the constructor) and then calls register_bs_module();
 *   - LD_PRELOAD=bs_blkps.so tgtd ...: only the constructor runs.
 * Asking tgtd rather than keeping a flag also covers both at once (a
 * preloaded build beside an installed one): the first loaded wins.
 */
void register_bs_module(void)
{
	unsigned char opcodes[] = {
		ALLOW_MEDIUM_REMOVAL,
		INQUIRY,
		MAINT_PROTOCOL_IN,
		MODE_SELECT,
		MODE_SELECT_10,
		MODE_SENSE,
		MODE_SENSE_10,
		PERSISTENT_RESERVE_IN,
		PERSISTENT_RESERVE_OUT,
		READ_10,
		READ_12,
		READ_16,
		READ_6,
		READ_CAPACITY,
		RELEASE,
		REPORT_LUNS,
		REQUEST_SENSE,
		RESERVE,
		SEND_DIAGNOSTIC,
		SERVICE_ACTION_IN,
		START_STOP,
		SYNCHRONIZE_CACHE,
		SYNCHRONIZE_CACHE_16,
		TEST_UNIT_READY,
		WRITE_10,
		WRITE_12,
		WRITE_16,
		WRITE_6,
	};

	if (get_backingstore_template(blkps_bst.bs_name))
		return;
	bs_create_opcode_map(&blkps_bst, opcodes, ARRAY_SIZE(opcodes));
	register_backingstore_template(&blkps_bst);
}

/*
 * tgt allocates each command's data buffer (up to MaxBurstLength) with
 * malloc and frees it on completion. With glibc's defaults the heap top is
 * trimmed and re-grown around those frees, so every READ filled by us pays a
 * page fault and a page clear per 4 KiB, about a fifth of tgtd's time at
 * 1 MiB requests. Keep buffers of up to 32 MiB on the heap, and up to
 * 256 MiB of freed heap untrimmed, so that buffers are reused.
 */
static void keep_command_buffers(void)
{
	mallopt(M_MMAP_THRESHOLD, 32 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

static void log_line(const char *line)
{
	eprintf("blkps: %s\n", line);
}

__attribute__((constructor)) static void bs_blkps_constructor(void)
{
	keep_command_buffers();
	blkps_set_log(log_line);
	register_bs_module();
}
