/*
 * plugio_fio.h: the Rust side of the plugio fio engine, as the C shim sees
 * it (benches/fio-engine/src/ffi.rs implements these functions).
 *
 * SPDX-License-Identifier: GPL-2.0-only
 */
#ifndef PLUGIO_FIO_H
#define PLUGIO_FIO_H

#include <stddef.h>
#include <stdint.h>

/* Same layout as `EngineConfig` (src/config.rs). */
struct plugio_fio_config {
	uint32_t iodepth;
	uint32_t queue_depth;
	uint32_t nomerges;
	uint32_t plug_max;
	uint64_t plug_flush_bytes;
	uint64_t max_merge_bytes;
	uint32_t batch_wait_us;
	uint32_t overlap_order;
	uint32_t fixedbufs;
	uint32_t registerfiles;
	uint32_t defer_taskrun;
	uint32_t sq_entries;
	uint64_t iomem_bytes;
	uint32_t bounce_unaligned;
	uint32_t numjobs;
	uint32_t batch_wait_timer;
	uint32_t pad;
};

/* `CONFIG_BYTES` in src/config.rs. */
#define PLUGIO_FIO_CONFIG_BYTES 80

/* `Op` in src/core.rs. */
enum plugio_fio_op {
	PLUGIO_FIO_READ = 0,
	PLUGIO_FIO_WRITE = 1,
	PLUGIO_FIO_SYNC = 2,
	PLUGIO_FIO_DATASYNC = 3,
	PLUGIO_FIO_TRIM = 4,
};

/* `Access` in src/core.rs. */
enum plugio_fio_access {
	PLUGIO_FIO_READ_WRITE = 0,
	PLUGIO_FIO_READS = 1,
	PLUGIO_FIO_READ_ONLY = 2,
};

struct plugio_fio_core;

struct plugio_fio_core *plugio_fio_core_new(const struct plugio_fio_config *cfg,
					    char *err, size_t err_len);
void plugio_fio_core_free(struct plugio_fio_core *core);
void *plugio_fio_iomem_alloc(struct plugio_fio_core *core, size_t len,
			     int *registered);
void plugio_fio_iomem_free(struct plugio_fio_core *core);
/* Returns a device id (> 0), or 0 with *errno_out, *direct_refused, err. */
size_t plugio_fio_open(struct plugio_fio_core *core, const char *path,
		       int direct, uint32_t access, int *errno_out,
		       int *direct_refused, char *err, size_t err_len);
void plugio_fio_close(struct plugio_fio_core *core, size_t dev);
int plugio_fio_queue(struct plugio_fio_core *core, size_t dev, uint32_t op,
		     uint64_t offset, void *buf, uint64_t len, void *cookie);
int plugio_fio_commit(struct plugio_fio_core *core);
int plugio_fio_getevents(struct plugio_fio_core *core, uint32_t min,
			 uint32_t max, int64_t timeout_ns);
void *plugio_fio_event(struct plugio_fio_core *core, uint32_t i,
		       int64_t *result);
void plugio_fio_stats(struct plugio_fio_core *core, size_t dev, char *buf,
		      size_t len);

/* Defined by the shim, returned to fio by the Rust `get_ioengine`. */
void *plugio_fio_ioengine_ops(void);

#endif
