/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0 */
/*
 * Which build a loaded program came from. The daemon sets hm_build_mark
 * when it loads an object, to a hash of that object's instructions
 * (build_mark in daemon/src/backends/bpf/objects.rs); `hostmesh explain`
 * reads it back through the program's maps to say whether an attached
 * program is the installed binary's. It is alone in its section, so it
 * is a map of its own (".rodata.hm_mark") with the mark at offset 0.
 */
#ifndef HOSTMESH_BUILD_MARK_H
#define HOSTMESH_BUILD_MARK_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

const volatile __u64 hm_build_mark SEC(".rodata.hm_mark") = 0;

/* Every program reads the mark once (two instructions), so the kernel
 * lists the mark's map among the program's maps. */
#define HM_BUILD_MARK() asm volatile("" ::"r"(hm_build_mark))

#endif
