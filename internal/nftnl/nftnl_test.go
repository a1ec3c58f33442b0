package nftnl

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
)

func TestDatatype(t *testing.T) {
	k := Concat(TypeIPAddr, TypeInetProto, TypeInetService)
	if got := k.Fields(); !cmp.Equal(got, []Datatype{TypeIPAddr, TypeInetProto, TypeInetService}) {
		t.Errorf("fields %v", got)
	}
	if k.Len() != 12 || TypeInetProto.Len() != 1 || Concat(TypeMark, TypeIP6Addr).Len() != 20 {
		t.Errorf("lengths %d %d %d", k.Len(), TypeInetProto.Len(), Concat(TypeMark, TypeIP6Addr).Len())
	}
	if s := k.String(); s != "ipv4_addr . inet_proto . inet_service" {
		t.Errorf("String %q", s)
	}
	if got := Concat(TypeIPAddr, TypeInetProto, TypeInetService, TypeIPAddr).FieldLens(); !cmp.Equal(got, []uint32{4, 1, 2, 4}) {
		t.Errorf("field lengths %v", got)
	}
	// nft's own encoding of ipv4_addr . inet_proto . inet_service.
	if k != 7<<12|12<<6|13 {
		t.Errorf("magic %#x", uint32(k))
	}
}

func TestFamilyKeys(t *testing.T) {
	f4, f6 := FamilyOf(model.IPv4), FamilyOf(model.IPv6)
	if got := f4.Key(netip.MustParseAddr("10.96.0.1"), model.TCP, 80); !cmp.Equal(got, []byte{10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0}) {
		t.Errorf("IPv4 key %v", got)
	}
	if got := f4.Addr(netip.MustParseAddr("::ffff:10.0.0.1")); !cmp.Equal(got, []byte{10, 0, 0, 1}) {
		t.Errorf("mapped address %v", got)
	}
	if got := f6.Key(netip.MustParseAddr("fd00::1"), model.UDP, 53); len(got) != 24 || got[16] != unix.IPPROTO_UDP || got[21] != 53 {
		t.Errorf("IPv6 key %v", got)
	}
	if got := PortKey(model.SCTP, 30000); !cmp.Equal(got, []byte{unix.IPPROTO_SCTP, 0, 0, 0, 0x75, 0x30, 0, 0}) {
		t.Errorf("port key %v", got)
	}
	if f4.Name() != "ip" || f6.Name() != "ip6" || f6.PortUnreach != 4 || f4.DaddrOff != 16 || f6.SaddrOff != 8 {
		t.Errorf("family facts %+v %+v", f4, f6)
	}
	if got := LastAddr(netip.MustParsePrefix("198.51.100.0/23")); got != netip.MustParseAddr("198.51.101.255") {
		t.Errorf("last address %v", got)
	}
}

func TestBatchSplitsElements(t *testing.T) {
	tx := NewBatch(unix.NFPROTO_IPV4, "t")
	var els []Elem
	for i := range 20000 {
		els = append(els, Elem{Key: binary.BigEndian.AppendUint64(make([]byte, 8), uint64(i)), Val: []byte{10, 0, 0, 1, 0, 80, 0, 0}})
	}
	tx.AddElems("m", els)
	if tx.Err() != nil {
		t.Fatal(tx.Err())
	}
	if tx.Len() < 10 {
		t.Fatalf("%d messages for 20000 elements", tx.Len())
	}
	msgs, err := DecodeBatch(tx.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range msgs {
		n += len(m.Elems)
	}
	if len(msgs) != tx.Len() || n != len(els) {
		t.Fatalf("decoded %d messages with %d elements, want %d and %d", len(msgs), n, tx.Len(), len(els))
	}
}

// sampleBatch builds a batch with every kind of message and every
// expression the backends emit.
func sampleBatch(t *testing.T, f Family, table string) *Batch {
	t.Helper()
	tx := NewBatch(f.Proto, table)
	tx.AddTable()
	tx.AddSet(&Set{Name: "svc", ID: 1, Key: Concat(f.AddrType, TypeInetProto, TypeInetService), Data: TypeVerdict, Comment: "dispatch"})
	tx.AddSet(&Set{Name: "eps", ID: 2, Key: TypeIP6Addr, Data: Concat(f.AddrType, TypeInetService), Interval: true})
	tx.AddSet(&Set{Name: "aff", ID: 3, Key: Concat(TypeMark, f.AddrType), Timeout: true, Dynamic: true, Size: 64})
	tx.AddSet(&Set{Name: "allow", ID: 4, Key: Concat(f.AddrType, TypeInetProto, TypeInetService, f.AddrType), Interval: true})
	tx.AddChain("target", nil)
	tx.AddChain("pre", &Hook{Num: unix.NF_INET_PRE_ROUTING, Priority: -100, Type: "nat"})
	tx.AddChain("post", &Hook{Num: unix.NF_INET_POST_ROUTING, Priority: 100, Type: "nat"})
	tx.AddChain("filter", &Hook{Num: unix.NF_INET_LOCAL_IN, Priority: -110, Type: "filter"})
	key, next := f.KeyExprs()
	rules := []struct {
		chain string
		r     Rule
	}{
		{"pre", append(key[:len(key):len(key)], VMap("svc", Reg(0)))},
		{"pre", append(PortKeyExprs(), &expr.Counter{}, Jump("target"))},
		{"target", append(key[:len(key):len(key)],
			&expr.Hash{SourceRegister: Reg(0), DestRegister: Reg(0), Length: f.AddrLen + 8, Modulus: 0xffffffff, Seed: 0x70726f78, Type: expr.HashTypeJenkins},
			&expr.Immediate{Register: Reg(1), Data: make([]byte, 8)},
			&expr.Numgen{Register: Reg(3), Modulus: 65535, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: Reg(0), DestRegister: Reg(4), IsDestRegSet: true, SetName: "eps"},
			f.DNAT(Reg(4), Reg(4+f.AddrRegs())),
		)},
		{"target", Rule{
			&expr.Immediate{Register: Reg(0), Data: U32(7)}, f.LoadSaddr(Reg(1)), Lookup("aff", Reg(0), false),
			&expr.Dynset{SrcRegKey: Reg(0), SetName: "aff", Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: 3 * time.Hour},
			&expr.Redir{RegisterProtoMin: Reg(1)},
		}},
		{"post", MasqueradeMarked(0x4000)},
		{"filter", append(append(CtStateNew(), FibLocal(false, expr.CmpOpEq)...), f.NotLoopbackDaddr()...)},
		{"filter", append(append(key[:len(key):len(key)], f.LoadSaddr(Reg(next)), Lookup("allow", Reg(0), true)), Drop())},
		{"filter", Rule{LoadDport(Reg(0)), &expr.Range{Op: expr.CmpOpEq, Register: Reg(0), FromData: []byte{0, 80}, ToData: []byte{0, 90}}, f.Reject()}},
		{"filter", append(SetMark(0x10), Return())},
	}
	for _, r := range rules {
		enc, err := Encode(f.Proto, r.r)
		if err != nil {
			t.Fatal(err)
		}
		tx.AddRule(r.chain, enc)
	}
	a := netip.MustParseAddr("10.96.0.1")
	ep := netip.MustParseAddr("10.0.1.2")
	if f.AddrLen == 16 {
		a, ep = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00:1::2")
	}
	tx.SetOwner("web")
	tx.AddElems("svc", []Elem{
		{Key: f.Key(a, model.UDP, 53), Verdict: &Verdict{Code: VerdictDrop}},
		{Key: f.Key(a, model.TCP, 80), Verdict: &Verdict{Code: unix.NFT_GOTO, Chain: "target"}},
	})
	// The range map's key: the hash the target chain computes of the
	// flow, 8 zero bytes, then the random position.
	k := binary.NativeEndian.AppendUint32(nil, ReciprocalScale(Jhash(f.Key(a, model.TCP, 80), 0x70726f78), 0xffffffff))
	k = append(k, make([]byte, 12)...)
	end := append([]byte{}, k...)
	end[12] = 0xff
	tx.AddElems("eps", []Elem{{Key: k, Val: append(f.Addr(ep), Port(8080)...)}, {Key: end, IntervalEnd: true}})
	tx.AddElems("allow", []Elem{{Key: append(f.Key(a, model.TCP, 80), f.Addr(ep)...), KeyEnd: append(f.Key(a, model.TCP, 80), f.Addr(ep.Next())...)}})
	tx.SetOwner(nil)
	return tx
}

const sampleText = `add table ip t
add map ip t svc { type ipv4_addr . inet_proto . inet_service : verdict; comment "dispatch"; }
add map ip t eps { type ipv6_addr : ipv4_addr . inet_service; flags interval; }
add set ip t aff { type mark . ipv4_addr; flags timeout,dynamic; size 64; }
add set ip t allow { type ipv4_addr . inet_proto . inet_service . ipv4_addr; flags interval; }
add chain ip t target
add chain ip t pre { type nat hook prerouting priority -100; policy accept; }
add chain ip t post { type nat hook postrouting priority 100; policy accept; }
add chain ip t filter { type filter hook input priority -110; policy accept; }
add rule ip t pre [ payload load 4b @ network header + 16 => reg 8 ] [ meta load l4proto => reg 9 ] [ payload load 2b @ transport header + 2 => reg 10 ] [ lookup reg 8 set svc dreg 0 ]
add rule ip t pre [ meta load l4proto => reg 8 ] [ payload load 2b @ transport header + 2 => reg 9 ] [ counter pkts 0 bytes 0 ] [ immediate reg 0 jump target ]
add rule ip t target [ payload load 4b @ network header + 16 => reg 8 ] [ meta load l4proto => reg 9 ] [ payload load 2b @ transport header + 2 => reg 10 ] [ hash reg 8 = jhash(reg 8, 12, 0x70726f78) % mod 4294967295 ] [ immediate reg 9 0x00000000 0x00000000 ] [ numgen reg 11 = random mod 65535 offset 0 ] [ lookup reg 8 set eps dreg 12 ] [ nat dnat ip addr_min reg 12 proto_min reg 13 flags 0x2 ]
add rule ip t target [ immediate reg 8 0x00000007 ] [ payload load 4b @ network header + 12 => reg 9 ] [ lookup reg 8 set aff ] [ dynset update reg_key 8 set aff timeout 10800000ms ] [ redir flags 0x0 proto_min reg 9 ]
add rule ip t post [ meta load mark => reg 8 ] [ bitwise reg 9 = ( reg 8 & 0x00004000 ) ^ 0x00000000 ] [ cmp neq reg 9 0x00000000 ] [ bitwise reg 8 = ( reg 8 & 0xffffbfff ) ^ 0x00000000 ] [ meta set mark with reg 8 ] [ masq flags 0x10 ]
add rule ip t filter [ ct load state => reg 8 ] [ bitwise reg 8 = ( reg 8 & 0x00000008 ) ^ 0x00000000 ] [ cmp neq reg 8 0x00000000 ] [ fib daddr type => reg 8 ] [ cmp eq reg 8 0x00000002 ] [ payload load 4b @ network header + 16 => reg 8 ] [ bitwise reg 8 = ( reg 8 & 0x000000ff ) ^ 0x00000000 ] [ cmp neq reg 8 0x0000007f ]
add rule ip t filter [ payload load 4b @ network header + 16 => reg 8 ] [ meta load l4proto => reg 9 ] [ payload load 2b @ transport header + 2 => reg 10 ] [ payload load 4b @ network header + 12 => reg 11 ] [ lookup reg 8 set allow invert ] [ immediate reg 0 drop ]
add rule ip t filter [ payload load 2b @ transport header + 2 => reg 8 ] [ range eq reg 8 0x00005000 0x00005a00 ] [ reject type 0 code 3 ]
add rule ip t filter [ meta load mark => reg 8 ] [ bitwise reg 8 = ( reg 8 & 0xffffffef ) ^ 0x00000010 ] [ meta set mark with reg 8 ] [ immediate reg 0 return ]
add element ip t svc {
	10.96.0.1 . tcp . 80 : goto target
	10.96.0.1 . udp . 53 : drop
}
add element ip t eps {
	5d05:d589:: : 10.0.1.2 . 8080
	5d05:d589::ff00:0 (interval end)
}
add element ip t allow { 10.96.0.1 . tcp . 80 . 10.0.1.2 - 10.96.0.1 . tcp . 80 . 10.0.1.3 }
`

func TestRecorderText(t *testing.T) {
	if !nativeLittle() {
		t.Skip("the expected text has host-order words of a little-endian host")
	}
	rec := NewRecorder()
	if err := rec.Commit(t.Context(), sampleBatch(t, FamilyOf(model.IPv4), "t")); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(sampleText, rec.Last()); d != "" {
		t.Errorf("text (-want +got):\n%s", d)
	}
	// Queries answer from the model.
	chains, ok, err := rec.Chains(t.Context(), unix.NFPROTO_IPV4, "t")
	if err != nil || !ok || !cmp.Equal(chains, []string{"filter", "post", "pre", "target"}) {
		t.Errorf("chains %v %v %v", chains, ok, err)
	}
	els, err := rec.SetElements(t.Context(), unix.NFPROTO_IPV4, "t", "svc")
	if err != nil || len(els) != 2 || els[0].Verdict == nil || els[0].Verdict.Chain != "target" {
		t.Errorf("elements %+v %v", els, err)
	}
	if _, ok, _ := rec.Chains(t.Context(), unix.NFPROTO_IPV6, "t"); ok {
		t.Error("the ip6 table exists")
	}
}

func nativeLittle() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }

func TestRecorderRejects(t *testing.T) {
	rec := NewRecorder()
	ctx := t.Context()
	tx := NewBatch(unix.NFPROTO_IPV4, "t")
	tx.AddTable()
	tx.AddChain("a", nil)
	if err := rec.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	// A rule to a missing chain names its owner; nothing of the batch
	// applies.
	owner := &struct{ name string }{"svc"}
	tx = NewBatch(unix.NFPROTO_IPV4, "t")
	tx.AddChain("b", nil)
	tx.SetOwner(owner)
	tx.AddRule("missing", nil)
	tx.SetOwner(nil)
	err := rec.Commit(ctx, tx)
	var txErr *TxError
	if !errors.As(err, &txErr) || len(txErr.Failures) != 1 || txErr.Failures[0].Owner != owner ||
		txErr.Failures[0].What != "add rule to chain missing" || !errors.Is(err, unix.ENOENT) {
		t.Fatalf("commit: %+v", err)
	}
	if chains, _, _ := rec.Chains(ctx, unix.NFPROTO_IPV4, "t"); !cmp.Equal(chains, []string{"a"}) {
		t.Errorf("a rejected batch applied: chains %v", chains)
	}
	if len(rec.Batches()) != 1 {
		t.Errorf("%d batches recorded, want 1", len(rec.Batches()))
	}
	// Deleting a table only if empty.
	tx = NewBatch(unix.NFPROTO_IPV4, "t")
	tx.DelTableIfEmpty()
	if err := rec.Commit(ctx, tx); !errors.Is(err, unix.EBUSY) {
		t.Errorf("deleting a table with a chain if empty: %v", err)
	}
	tx = NewBatch(unix.NFPROTO_IPV4, "t")
	tx.DelChain("a")
	tx.DelTableIfEmpty()
	if err := rec.Commit(ctx, tx); err != nil {
		t.Errorf("deleting an emptied table: %v", err)
	}
	if !strings.Contains(rec.Last(), "delete table ip t # only if empty") {
		t.Errorf("text %q", rec.Last())
	}
	// A set redefined differently.
	tx = NewBatch(unix.NFPROTO_IPV4, "t")
	tx.AddTable()
	tx.AddSet(&Set{Name: "s", Key: TypeIPAddr})
	tx.AddSet(&Set{Name: "s", Key: TypeIPAddr, Interval: true})
	if err := rec.Commit(ctx, tx); !errors.Is(err, unix.EEXIST) {
		t.Errorf("redefined set: %v", err)
	}
}
