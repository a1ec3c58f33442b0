package nftnl

import (
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file builds the expressions the backends' rules share. A rule is
// a slice of google/nftables expressions; [Encode] encodes it.

// Rule is a rule's expressions, in order.
type Rule = []expr.Any

// Reg returns the 32-bit register n (NFT_REG32_00 + n). nf_tables has
// sixteen; a concatenated key occupies consecutive ones, and a rule may
// only read registers it wrote itself.
func Reg(n uint32) uint32 { return unix.NFT_REG32_00 + n }

// RegVerdict is the verdict register, the destination of a verdict map
// lookup.
const RegVerdict = unix.NFT_REG_VERDICT

// rtnLocal is RTN_LOCAL, the fib address type of local addresses.
const rtnLocal = 2

// LoadSaddr loads the source address into register r.
func (f *Family) LoadSaddr(r uint32) expr.Any {
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseNetworkHeader, Offset: f.SaddrOff, Len: f.AddrLen}
}

// LoadDaddr loads the destination address into register r.
func (f *Family) LoadDaddr(r uint32) expr.Any {
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseNetworkHeader, Offset: f.DaddrOff, Len: f.AddrLen}
}

// LoadL4Proto loads the transport protocol into register r.
func LoadL4Proto(r uint32) expr.Any {
	return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r}
}

// LoadDport loads the transport destination port into register r.
func LoadDport(r uint32) expr.Any {
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// KeyExprs loads daddr . l4proto . dport (see [Family.Key]) into
// consecutive registers from Reg(0), and returns the number of the first
// register after the key.
func (f *Family) KeyExprs() (Rule, uint32) {
	n := f.AddrRegs()
	return Rule{f.LoadDaddr(Reg(0)), LoadL4Proto(Reg(n)), LoadDport(Reg(n + 1))}, n + 2
}

// PortKeyExprs loads l4proto . dport (see [PortKey]) from Reg(0).
func PortKeyExprs() Rule {
	return Rule{LoadL4Proto(Reg(0)), LoadDport(Reg(1))}
}

// Lookup matches when the key in register r is (invert: is not) in set.
func Lookup(set string, r uint32, invert bool) expr.Any {
	return &expr.Lookup{SourceRegister: r, SetName: set, Invert: invert}
}

// VMap looks the key in register r up in verdict map set and applies the
// verdict it maps to.
func VMap(set string, r uint32) expr.Any {
	return &expr.Lookup{SourceRegister: r, DestRegister: RegVerdict, IsDestRegSet: true, SetName: set}
}

// Goto is the verdict "goto chain".
func Goto(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain} }

// Jump is the verdict "jump chain".
func Jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

// Return is the verdict "return".
func Return() expr.Any { return &expr.Verdict{Kind: expr.VerdictReturn} }

// Drop is the verdict "drop".
func Drop() expr.Any { return &expr.Verdict{Kind: expr.VerdictDrop} }

// CtStateNew matches packets of new connections (ct state new).
func CtStateNew() Rule {
	return Rule{
		&expr.Ct{Register: Reg(0), Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: Reg(0), DestRegister: Reg(0), Len: 4,
			Mask: U32(expr.CtStateBitNEW), Xor: U32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: Reg(0), Data: U32(0)},
	}
}

// FibLocal matches packets whose source (saddr) or destination address
// is (op CmpOpEq) or is not (CmpOpNeq) local: fib saddr|daddr type local.
func FibLocal(saddr bool, op expr.CmpOp) Rule {
	return Rule{
		&expr.Fib{Register: Reg(0), ResultADDRTYPE: true, FlagSADDR: saddr, FlagDADDR: !saddr},
		&expr.Cmp{Op: op, Register: Reg(0), Data: U32(rtnLocal)},
	}
}

// NotLoopbackDaddr excludes 127.0.0.0/8 or ::1 as destinations.
func (f *Family) NotLoopbackDaddr() Rule {
	if f.AddrLen == 4 {
		return Rule{
			f.LoadDaddr(Reg(0)),
			&expr.Bitwise{SourceRegister: Reg(0), DestRegister: Reg(0), Len: 4,
				Mask: []byte{255, 0, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: Reg(0), Data: []byte{127, 0, 0, 0}},
		}
	}
	one := make([]byte, 16)
	one[15] = 1
	return Rule{f.LoadDaddr(Reg(0)), &expr.Cmp{Op: expr.CmpOpNeq, Register: Reg(0), Data: one}}
}

// SetMark ORs bit into the packet mark.
func SetMark(bit uint32) Rule {
	return Rule{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: Reg(0)},
		&expr.Bitwise{SourceRegister: Reg(0), DestRegister: Reg(0), Len: 4, Mask: U32(^bit), Xor: U32(bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: Reg(0)},
	}
}

// Masquerade masquerades with fully random source ports.
func Masquerade() expr.Any { return &expr.Masq{FullyRandom: true} }

// MasqueradeMarked masquerades packets carrying bit, clearing it.
func MasqueradeMarked(bit uint32) Rule {
	return Rule{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: Reg(0)},
		&expr.Bitwise{SourceRegister: Reg(0), DestRegister: Reg(1), Len: 4, Mask: U32(bit), Xor: U32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: Reg(1), Data: U32(0)},
		&expr.Bitwise{SourceRegister: Reg(0), DestRegister: Reg(0), Len: 4, Mask: U32(^bit), Xor: U32(0)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: Reg(0)},
		Masquerade(),
	}
}

// Reject rejects with ICMP (ICMPv6) port unreachable.
func (f *Family) Reject() expr.Any {
	return &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: f.PortUnreach}
}

// DNAT translates the destination to the address in register addr and
// the port in register port.
func (f *Family) DNAT(addr, port uint32) expr.Any {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f.Proto), RegAddrMin: addr, RegProtoMin: port, Specified: true}
}
