package main

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/sandbox"
)

// agentTable is the agent's own table, "inet cni-agent". proxykit owns
// "ip proxykit" and "ip6 proxykit" and never touches any other table.
const agentTable = "cni-agent"

// conn returns a google/nftables connection to the pod's namespace and a
// function that releases it.
func conn(pod *sandbox.Pod) (*nftables.Conn, func(), error) {
	f, err := os.Open(pod.NetNSPath())
	if err != nil {
		return nil, nil, err
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return c, func() { f.Close() }, nil
}

// addPolicy creates the agent's table with an egress chain that rejects
// TCP from the pod to dst:port with a reset, counting what it rejects:
//
//	table inet cni-agent {
//		chain egress {
//			type filter hook output priority filter; policy accept;
//			meta nfproto ipv4 ip daddr DST tcp dport PORT counter reject with tcp reset
//		}
//	}
func addPolicy(pod *sandbox.Pod, dst netip.Addr, port uint16) error {
	c, done, err := conn(pod)
	if err != nil {
		return err
	}
	defer done()
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: agentTable})
	ch := c.AddChain(&nftables.Chain{
		Name: "egress", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter,
	})
	p := binary.BigEndian.AppendUint16(nil, port)
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst.AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p},
		&expr.Counter{},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}})
	return c.Flush()
}

// listTables returns "family name" of every table in the pod's namespace.
func listTables(pod *sandbox.Pod) ([]string, error) {
	c, done, err := conn(pod)
	if err != nil {
		return nil, err
	}
	defer done()
	ts, err := c.ListTables()
	if err != nil {
		return nil, err
	}
	fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6", nftables.TableFamilyINet: "inet"}
	var out []string
	for _, t := range ts {
		out = append(out, fam[t.Family]+" "+t.Name)
	}
	slices.Sort(out)
	return out, nil
}

// policyHits returns the packets the agent's rule rejected.
func policyHits(pod *sandbox.Pod) (uint64, error) {
	c, done, err := conn(pod)
	if err != nil {
		return 0, err
	}
	defer done()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: agentTable}
	rules, err := c.GetRules(t, &nftables.Chain{Name: "egress", Table: t})
	if err != nil {
		return 0, err
	}
	for _, r := range rules {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				return ctr.Packets, nil
			}
		}
	}
	return 0, fmt.Errorf("no counter in the agent's rule")
}
