/*
 * plugio_fio.c: fio's ioengine hooks for the plugio engine.
 *
 * A thin shim: it reads and writes fio's structures (with fio's own
 * headers, macros and inline functions, from the fio source tree the
 * engine is built against) and calls the Rust side through plugio_fio.h.
 * Everything plugio does happens in Rust (src/core.rs).
 *
 * Load with: fio --ioengine=external:/path/to/libplugio_fio.so ...
 * Options:   fio --enghelp=external:/path/to/libplugio_fio.so
 *
 * SPDX-License-Identifier: GPL-2.0-only
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fio.h"
#include "optgroup.h"

#include "plugio_fio.h"

_Static_assert(sizeof(struct plugio_fio_config) == PLUGIO_FIO_CONFIG_BYTES,
	       "struct plugio_fio_config does not match src/config.rs");

/* The engine's options (td->eo). The first member must be a pointer: fio
 * stores the thread_data there (init.c), and no option may sit at
 * offset 0. */
struct plugio_options {
	void *pad;
	unsigned int queue_depth;
	unsigned int nomerges;
	unsigned int plug_max;
	unsigned int batch_wait_us;
	unsigned long long plug_flush_bytes;
	unsigned long long max_merge_bytes;
	unsigned int overlap_order;
	unsigned int fixedbufs;
	unsigned int registerfiles;
	unsigned int defer_taskrun;
	unsigned int sq_entries;
	unsigned int stats;
	unsigned int bounce_unaligned;
	unsigned int batch_wait_timer;
};

static struct fio_option options[] = {
	{
		.name	= "plugio_queue_depth",
		.lname	= "plugio tags per device",
		.type	= FIO_OPT_INT,
		.off1	= offsetof(struct plugio_options, queue_depth),
		.help	= "Tags of the device: requests in flight at once (DeviceOptions::queue_depth); 0 = iodepth x numjobs, at least 256",
		.def	= "0",
		.minval	= 0,
		.maxval	= 65536,
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_nomerges",
		.lname	= "plugio nomerges",
		.type	= FIO_OPT_INT,
		.off1	= offsetof(struct plugio_options, nomerges),
		.help	= "Merging, as /sys/block/*/queue/nomerges: 0 all merges, 1 only the one-hit merge, 2 none",
		.def	= "0",
		.minval	= 0,
		.maxval	= 2,
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_plug_max",
		.lname	= "plugio plug max count",
		.type	= FIO_OPT_INT,
		.off1	= offsetof(struct plugio_options, plug_max),
		.help	= "Bios in the plug before it is flushed early (BLK_MAX_REQUEST_COUNT); 1 turns plugging off",
		.def	= "32",
		.minval	= 1,
		.maxval	= 65536,
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_plug_flush_bytes",
		.lname	= "plugio plug flush size",
		.type	= FIO_OPT_STR_VAL,
		.off1	= offsetof(struct plugio_options, plug_flush_bytes),
		.help	= "Bytes in the plug before it is flushed early (BLK_PLUG_FLUSH_SIZE); 0 disables the byte trigger",
		.def	= "128k",
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_max_merge_bytes",
		.lname	= "plugio largest merged request",
		.type	= FIO_OPT_STR_VAL,
		.off1	= offsetof(struct plugio_options, max_merge_bytes),
		.help	= "Largest request merging builds; 0 = the device's request limit",
		.def	= "0",
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_batch_wait_us",
		.lname	= "plugio completion batch wait",
		.type	= FIO_OPT_INT,
		.off1	= offsetof(struct plugio_options, batch_wait_us),
		.help	= "Longest wait (microseconds) of a park for a batch of up to 32 completions (RingConfig::batch_wait); 0 wakes on the first",
		.def	= "100",
		.minval	= 0,
		.maxval	= 1000000,
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_batch_wait_timer",
		.lname	= "plugio batch wait timer",
		.type	= FIO_OPT_BOOL,
		.off1	= offsetof(struct plugio_options, batch_wait_timer),
		.help	= "Arm the batch wait's bound as a kernel timer on every batched wait (RingConfig::batch_wait_timer = Always); 0 arms it only after a late batch (WhenLate)",
		.def	= "0",
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_overlap_order",
		.lname	= "plugio overlap ordering",
		.type	= FIO_OPT_BOOL,
		.off1	= offsetof(struct plugio_options, overlap_order),
		.help	= "Keep overlapping IO in program order (a request waits for the earlier ones it overlaps where one writes); 0 orders nothing, as fio's own engines",
		.def	= "1",
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_fixedbufs",
		.lname	= "plugio registered io_u memory",
		.type	= FIO_OPT_BOOL,
		.off1	= offsetof(struct plugio_options, fixedbufs),
		.help	= "io_u buffers from plugio's registered arena (READ_FIXED/WRITE_FIXED)",
		.def	= "1",
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_registerfiles",
		.lname	= "plugio registered files",
		.type	= FIO_OPT_BOOL,
		.off1	= offsetof(struct plugio_options, registerfiles),
		.help	= "Register the files with the ring (a 64-slot registered-file table)",
		.def	= "1",
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_defer_taskrun",
		.lname	= "plugio DEFER_TASKRUN",
		.type	= FIO_OPT_BOOL,
		.off1	= offsetof(struct plugio_options, defer_taskrun),
		.help	= "Try IORING_SETUP_SINGLE_ISSUER + DEFER_TASKRUN, then COOP_TASKRUN (RingConfig::taskrun_flags)",
		.def	= "1",
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_sq_entries",
		.lname	= "plugio SQ size",
		.type	= FIO_OPT_INT,
		.off1	= offsetof(struct plugio_options, sq_entries),
		.help	= "SQ entries of the job's ring; 0 = max(256, iodepth) rounded up to a power of two",
		.def	= "0",
		.minval	= 0,
		.maxval	= 32768,
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_bounce_unaligned",
		.lname	= "plugio bounce unaligned io_u memory",
		.type	= FIO_OPT_BOOL,
		.off1	= offsetof(struct plugio_options, bounce_unaligned),
		.help	= "IO on io_u memory not aligned for direct IO (iomem_align) goes through an aligned buffer and a copy; 0 refuses it (EINVAL)",
		.def	= "1",
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= "plugio_stats",
		.lname	= "plugio iostats",
		.type	= FIO_OPT_BOOL,
		.off1	= offsetof(struct plugio_options, stats),
		.help	= "Print each file's plugio iostats (bios, requests, merges, fixed-buffer requests), the core's ticks and the ring's batched waits on stderr when it is closed",
		.def	= "0",
		.category = FIO_OPT_C_ENGINE,
		.group	= FIO_OPT_G_INVALID,
	},
	{
		.name	= NULL,
	},
};

/* td->io_ops_data */
struct plugio_data {
	struct plugio_fio_core *core;
	/* io_us queued since the last commit: their issue time is set there */
	struct io_u **queued;
	unsigned int nr_queued;
	unsigned int max_queued;
};

static struct plugio_data *pdata(struct thread_data *td)
{
	return td->io_ops_data;
}

/* Upper bound of what fio's allocate_io_mem() will ask iomem_alloc for
 * (backend.c init_io_u_buffers, memory.c allocate_io_mem). */
static uint64_t plugio_iomem_bytes(struct thread_data *td)
{
	if (!td_read(td) && !td_write(td))
		return 0;
	return (uint64_t) td_max_bs(td) * td->o.iodepth + 2 * page_mask +
		2 * (uint64_t) td->o.mem_align + page_size;
}

/*
 * The numjobs of the job this thread belongs to. fio makes the N threads of
 * a numjobs=N job by cloning the first, and sets numjobs=1 in each clone
 * (init.c, add_job); the clones follow their original in fio's thread table
 * (subjob_number 0 marks an original). Every thread of the job must ask for
 * the same tag count of a file they share, or the second open is refused.
 */
static unsigned int plugio_numjobs(struct thread_data *td)
{
	struct thread_data *t, *orig = td;
	int i;

	if (!td->subjob_number)
		return td->o.numjobs;
	for_each_td(t, i) {
		if (t == td)
			break;
		if (!t->subjob_number)
			orig = t;
	}
	return orig->o.numjobs;
}

static int plugio_init(struct thread_data *td)
{
	struct plugio_options *o = td->eo;
	struct plugio_fio_config cfg;
	struct plugio_data *d;
	char err[512];

	memset(&cfg, 0, sizeof(cfg));
	cfg.iodepth = td->o.iodepth;
	cfg.queue_depth = o->queue_depth;
	cfg.nomerges = o->nomerges;
	cfg.plug_max = o->plug_max;
	cfg.plug_flush_bytes = o->plug_flush_bytes;
	cfg.max_merge_bytes = o->max_merge_bytes;
	cfg.batch_wait_us = o->batch_wait_us;
	cfg.overlap_order = o->overlap_order;
	cfg.fixedbufs = o->fixedbufs;
	cfg.registerfiles = o->registerfiles;
	cfg.defer_taskrun = o->defer_taskrun;
	cfg.sq_entries = o->sq_entries;
	cfg.iomem_bytes = plugio_iomem_bytes(td);
	cfg.bounce_unaligned = o->bounce_unaligned;
	cfg.numjobs = plugio_numjobs(td);
	cfg.batch_wait_timer = o->batch_wait_timer;

	d = calloc(1, sizeof(*d));
	if (!d)
		return 1;
	d->max_queued = td->o.iodepth ? td->o.iodepth : 1;
	d->queued = calloc(d->max_queued, sizeof(struct io_u *));
	if (!d->queued) {
		free(d);
		return 1;
	}
	err[0] = 0;
	d->core = plugio_fio_core_new(&cfg, err, sizeof(err));
	if (!d->core) {
		log_err("fio: %s\n", err);
		free(d->queued);
		free(d);
		td_verror(td, EINVAL, "plugio init");
		return 1;
	}
	td->io_ops_data = d;
	return 0;
}

static void plugio_cleanup(struct thread_data *td)
{
	struct plugio_data *d = pdata(td);

	if (!d)
		return;
	plugio_fio_core_free(d->core);
	free(d->queued);
	free(d);
	td->io_ops_data = NULL;
}

static int plugio_iomem_alloc(struct thread_data *td, size_t total_mem)
{
	int registered = 0;

	td->orig_buffer = plugio_fio_iomem_alloc(pdata(td)->core, total_mem,
						 &registered);
	if (!td->orig_buffer)
		return 1;
	dprint(FD_MEM, "plugio: %zu bytes of io_u memory at %p, %sregistered\n",
	       total_mem, td->orig_buffer, registered ? "" : "not ");
	return 0;
}

static void plugio_iomem_free(struct thread_data *td)
{
	if (pdata(td))
		plugio_fio_iomem_free(pdata(td)->core);
}

static int plugio_open_file(struct thread_data *td, struct fio_file *f)
{
	struct plugio_data *d = pdata(td);
	/* fio's --readonly: read-only, always. A job that only reads opens
	 * the file for writing too where it can, to share the device of a
	 * job thread writing the same file (see Access::Reads). */
	uint32_t access = read_only ? PLUGIO_FIO_READ_ONLY
		: (td_write(td) || td_trim(td)) ? PLUGIO_FIO_READ_WRITE
		: PLUGIO_FIO_READS;
	int err = 0, refused = 0;
	char msg[512], what[FIO_VERROR_SIZE];
	size_t dev;

	/* fio opens files before init too, from its main thread (setup_files
	 * -> get_file_size -> bdev_size for a block device's size): no plugio
	 * core exists there, so open it as fio's own engines do. */
	if (!d)
		return generic_open_file(td, f);

	msg[0] = 0;
	dev = plugio_fio_open(d->core, f->file_name, td->o.odirect,
			      access, &err, &refused, msg, sizeof(msg));
	if (!dev) {
		/* The messages fio's own open (filesetup.c) gives. */
		if (refused)
			log_err("fio: looks like your file system does not "
				"support direct=1/buffered=0\n");
		else
			log_err("fio: %s\n", msg);
		snprintf(what, sizeof(what), "open(%s)", f->file_name);
		td_verror(td, err ? err : EIO, what);
		return 1;
	}
	/* A plain descriptor for what fio itself does with f->fd (cache
	 * invalidation, fadvise hints); the IO goes through plugio. */
	f->fd = open(f->file_name, O_RDONLY | O_CLOEXEC);
	if (f->fd < 0) {
		err = errno;
		f->fd = -1;
		plugio_fio_close(d->core, dev);
		snprintf(what, sizeof(what), "open(%s)", f->file_name);
		td_verror(td, err, what);
		return 1;
	}
	FILE_SET_ENG_DATA(f, (void *) (uintptr_t) dev);
	return 0;
}

static int plugio_close_file(struct thread_data *td, struct fio_file *f)
{
	struct plugio_options *o = td->eo;
	struct plugio_data *d = pdata(td);
	size_t dev = (uintptr_t) FILE_ENG_DATA(f);
	char line[1024];

	if (dev && d) {
		if (o->stats) {
			line[0] = 0;
			plugio_fio_stats(d->core, dev, line, sizeof(line));
			/* On stderr: a forked job's log_info() output is lost
			 * with --output, and stdout may carry the JSON. */
			fprintf(stderr, "%s\n", line);
			fflush(stderr);
		}
		plugio_fio_close(d->core, dev);
	}
	if (!dev)
		return generic_close_file(td, f);
	FILE_SET_ENG_DATA(f, NULL);
	if (f->fd != -1) {
		close(f->fd);
		f->fd = -1;
	}
	return 0;
}

static enum fio_q_status plugio_queue(struct thread_data *td, struct io_u *io_u)
{
	struct plugio_data *d = pdata(td);
	size_t dev = (uintptr_t) FILE_ENG_DATA(io_u->file);
	uint32_t op;
	int ret;

	fio_ro_check(td, io_u);

	switch (io_u->ddir) {
	case DDIR_READ:
		op = PLUGIO_FIO_READ;
		break;
	case DDIR_WRITE:
		op = PLUGIO_FIO_WRITE;
		break;
	case DDIR_SYNC:
		op = PLUGIO_FIO_SYNC;
		break;
	case DDIR_DATASYNC:
		op = PLUGIO_FIO_DATASYNC;
		break;
	case DDIR_TRIM:
		op = PLUGIO_FIO_TRIM;
		break;
	default:
		/* sync_file_range, wait: no plugio op for them */
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	if (d->nr_queued == d->max_queued)
		return FIO_Q_BUSY;
	ret = plugio_fio_queue(d->core, dev, op, io_u->offset, io_u->xfer_buf,
			       io_u->xfer_buflen, io_u);
	if (ret) {
		io_u->error = ret;
		return FIO_Q_COMPLETED;
	}
	d->queued[d->nr_queued++] = io_u;
	return FIO_Q_QUEUED;
}

static int plugio_commit(struct thread_data *td)
{
	struct plugio_data *d = pdata(td);
	struct timespec now;
	unsigned int i;
	int ret;

	if (!d->nr_queued)
		return 0;
	ret = plugio_fio_commit(d->core);
	if (fio_fill_issue_time(td)) {
		fio_gettime(&now, NULL);
		for (i = 0; i < d->nr_queued; i++) {
			memcpy(&d->queued[i]->issue_time, &now, sizeof(now));
			io_u_queued(td, d->queued[i]);
		}
		/* only used for iolog */
		if (td->o.read_iolog_file)
			memcpy(&td->last_issue, &now, sizeof(now));
	}
	io_u_mark_submit(td, d->nr_queued);
	d->nr_queued = 0;
	return ret;
}

static int plugio_getevents(struct thread_data *td, unsigned int min,
			    unsigned int max, const struct timespec *t)
{
	struct plugio_data *d = pdata(td);
	int64_t timeout_ns = -1;
	int ret;

	/* IOs queued but not committed are issued by the ticks below; stamp
	 * their issue time as a commit would. */
	if (d->nr_queued) {
		ret = plugio_commit(td);
		if (ret < 0)
			return ret;
	}
	if (t)
		timeout_ns = (int64_t) t->tv_sec * 1000000000LL + t->tv_nsec;
	return plugio_fio_getevents(d->core, min, max, timeout_ns);
}

static struct io_u *plugio_event(struct thread_data *td, int event)
{
	int64_t res = 0;
	struct io_u *io_u = plugio_fio_event(pdata(td)->core, event, &res);

	if (!io_u)
		return NULL;
	io_u->error = 0;
	if (res < 0) {
		io_u->error = (int) -res;
	} else if (ddir_rw(io_u->ddir) && (uint64_t) res != io_u->xfer_buflen) {
		if ((uint64_t) res > io_u->xfer_buflen)
			io_u->error = EIO;
		else
			io_u->resid = io_u->xfer_buflen - res;
	}
	return io_u;
}

static struct ioengine_ops ioengine = {
	.name			= "plugio",
	.version		= FIO_IOOPS_VERSION,
	/* Hooks on the job thread only: the core is the thread's. */
	.flags			= FIO_NO_OFFLOAD | FIO_ASYNCIO_SETS_ISSUE_TIME,
	.init			= plugio_init,
	.queue			= plugio_queue,
	.commit			= plugio_commit,
	.getevents		= plugio_getevents,
	.event			= plugio_event,
	.cleanup		= plugio_cleanup,
	.open_file		= plugio_open_file,
	.close_file		= plugio_close_file,
	.get_file_size		= generic_get_file_size,
	.iomem_alloc		= plugio_iomem_alloc,
	.iomem_free		= plugio_iomem_free,
	.option_struct_size	= sizeof(struct plugio_options),
	.options		= options,
};

void *plugio_fio_ioengine_ops(void)
{
	return &ioengine;
}
