//! eBPF instructions for the feature probes (and tests): a few helpers
//! that build `bpf_insn` from the kernel's own opcode constants, as aya and
//! cilium/ebpf assemble their probes. Each is the instruction its name says.

use aya_obj::generated::bpf_func_id;
use aya_obj::generated::{
    BPF_ADD, BPF_ALU64, BPF_CALL, BPF_DW, BPF_EXIT, BPF_JMP, BPF_K, BPF_MEM, BPF_MOV, BPF_ST, BPF_X,
};

use super::sys::Insn;

/// One instruction, from its opcode parts (the kernel's own constants).
pub fn insn(code: u32, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    // SAFETY: bpf_insn is integers only; zeroes are a valid value.
    let mut i: Insn = unsafe { std::mem::zeroed() };
    i.code = code as u8;
    i.set_dst_reg(dst);
    i.set_src_reg(src);
    i.off = off;
    i.imm = imm;
    i
}

/// `mov64 dst, imm`
pub fn mov_imm(dst: u8, imm: i32) -> Insn {
    insn(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm)
}

/// `mov64 dst, src`
pub fn mov_reg(dst: u8, src: u8) -> Insn {
    insn(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0)
}

/// `dst += imm`
pub fn add_imm(dst: u8, imm: i32) -> Insn {
    insn(BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm)
}

/// `*(u64 *)(r10 + off) = 0`
pub fn zero_stack(off: i16) -> Insn {
    insn(BPF_ST | BPF_MEM | BPF_DW, 10, 0, off, 0)
}

pub fn call(helper: bpf_func_id) -> Insn {
    insn(BPF_JMP | BPF_CALL, 0, 0, 0, helper as i32)
}

pub fn exit() -> Insn {
    insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aya_obj::generated::bpf_func_id::BPF_FUNC_set_retval;

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        let m = mov_imm(2, 7);
        assert_eq!((m.code, m.dst_reg(), m.imm), (0xb7, 2, 7));
        let r = mov_reg(2, 10);
        assert_eq!((r.code, r.dst_reg(), r.src_reg()), (0xbf, 2, 10));
        let z = zero_stack(-48);
        assert_eq!((z.code, z.dst_reg(), z.off), (0x7a, 10, -48));
        let a = add_imm(2, -48);
        assert_eq!((a.code, a.dst_reg(), a.imm), (0x07, 2, -48));
        let c = call(BPF_FUNC_set_retval);
        assert_eq!((c.code, c.imm), (0x85, 187));
        assert_eq!(exit().code, 0x95);
    }
}
