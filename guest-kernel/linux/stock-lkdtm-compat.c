// SPDX-License-Identifier: GPL-2.0
/*
 * LKDTM built out of tree for a kernel that does not build it (Debian's: the stock
 * flavor, scripts/debian-kernel.sh). Such a kernel exports native_write_cr4 only for an
 * in-tree LKDTM (arch/x86/kernel/cpu/common.c), so LKDTM's UNSET_SMEP test finds its own
 * here, which does nothing: tandem's planted bugs use READ_AFTER_FREE, never UNSET_SMEP.
 */
#include <linux/types.h>
#include <asm/special_insns.h>

void native_write_cr4(unsigned long val) { }
