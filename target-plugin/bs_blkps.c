/*
 * bs_blkps: tgt backing store "blkps". A LUN of this type is a window onto a
 * blkps model: READ returns weights, WRITE applies a gradient, SYNCHRONIZE
 * CACHE is accepted.
 *
 *   tgtadm --op new --mode logicalunit --tid 1 --lun 1 --bstype blkps \
 *          --backing-store <model-name> --bsopts "params=1000000;lr=0.01"
 *
 * This file is the thin C shim over tgt (whose headers do not compile as
 * C++); the model and the options live in the C++ core behind lu.h.
 *
 * Commands run on tgt's bs_thread worker pool, never on tgtd's main thread:
 * bs_blkps_request() may take a model block lock. Errors become SCSI sense
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

#include "list.h"
#include "util.h"
#include "tgtd.h"
#include "scsi.h"
#include "bs_thread.h"

#include "lu.h"

#define BLKPS_ERRLEN 512

/* Per-LU private area tgt allocates after struct scsi_lu: the worker pool
 * first (BS_THREAD_I expects it there), then our core. */
struct bs_blkps_info {
	struct bs_thread_info threads;
	struct blkps_lu *core;
};

static struct bs_blkps_info *BS_BLKPS_I(struct scsi_lu *lu)
{
	return (struct bs_blkps_info *)BS_THREAD_I(lu);
}

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
	}
	eprintf("blkps: lun %" PRIu64 " %s at byte %" PRIu64 ": %s\n",
		cmd->dev->lun, what, cmd->offset, err);
}

/* Runs on a bs_thread worker. */
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
				  scsi_get_in_length(cmd), err, sizeof(err));
		complete_io(cmd, r, "read", err);
		break;
	case WRITE_6:
	case WRITE_10:
	case WRITE_12:
	case WRITE_16:
		r = blkps_lu_write(core, cmd->offset, scsi_get_out_buffer(cmd),
				   scsi_get_out_length(cmd), err, sizeof(err));
		complete_io(cmd, r, "gradient write", err);
		break;
	case SYNCHRONIZE_CACHE:
	case SYNCHRONIZE_CACHE_16:
		r = blkps_lu_sync(core, err, sizeof(err));
		complete_io(cmd, r, "synchronize cache", err);
		break;
	default:
		/* The opcode map below keeps other commands away from us. */
		set_sense(cmd, ILLEGAL_REQUEST, ASC_INVALID_OP_CODE);
		break;
	}
}

static tgtadm_err bs_blkps_init(struct scsi_lu *lu, char *bsopts)
{
	struct bs_blkps_info *info = BS_BLKPS_I(lu);
	char err[BLKPS_ERRLEN] = "";
	tgtadm_err ret;

	info->core = blkps_lu_create(bsopts, err, sizeof(err));
	if (!info->core) {
		eprintf("blkps: bad --bsopts '%s': %s\n", bsopts ? bsopts : "",
			err);
		return TGTADM_INVALID_REQUEST;
	}
	ret = bs_thread_open(&info->threads, bs_blkps_request, nr_iothreads);
	if (ret != TGTADM_SUCCESS) {
		blkps_lu_destroy(info->core);
		info->core = NULL;
	}
	return ret;
}

static void bs_blkps_exit(struct scsi_lu *lu)
{
	struct bs_blkps_info *info = BS_BLKPS_I(lu);

	bs_thread_close(&info->threads);
	blkps_lu_destroy(info->core);
	info->core = NULL;
}

static int bs_blkps_open(struct scsi_lu *lu, char *path, int *fd,
			 uint64_t *size)
{
	char err[BLKPS_ERRLEN] = "";

	if (blkps_lu_open(BS_BLKPS_I(lu)->core, path, size, err,
			  sizeof(err))) {
		eprintf("blkps: cannot create model '%s': %s\n", path, err);
		return -1;
	}
	*fd = -1;
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
	.bs_cmd_submit	= bs_thread_cmd_submit,
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

__attribute__((constructor)) static void bs_blkps_constructor(void)
{
	keep_command_buffers();
	register_bs_module();
}
