package iptables

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
)

// hintChains are chains kubelet creates in the flavour the host uses
// (kube-proxy's iptables wrapper looks for them too).
var hintChains = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// Counts summarizes one flavour's rule sets of both families.
type Counts struct {
	// Hints counts chains named by a caller's prefix or kubelet's hint
	// chains.
	Hints int
	// Rules counts rules.
	Rules int
}

// CountSave counts the hint chains and the rules in the output of a
// *-save. A chain is a hint when its name starts with one of prefixes
// followed by "-", or is one of kubelet's hint chains.
func CountSave(save []byte, prefixes ...string) Counts {
	var c Counts
	s := bufio.NewScanner(bytes.NewReader(save))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		l := s.Text()
		switch {
		case strings.HasPrefix(l, "-A "):
			c.Rules++
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l[1:], " ")
			for _, h := range hintChains {
				if name == h {
					c.Hints++
				}
			}
			for _, p := range prefixes {
				if strings.HasPrefix(name, p+"-") {
					c.Hints++
				}
			}
		}
	}
	return c
}

// Choose picks the flavour from both flavours' counts: the one with more
// hint chains, else the one with more rules, else nft.
func Choose(legacy, nft Counts) Flavour {
	switch {
	case legacy.Hints > nft.Hints:
		return Legacy
	case nft.Hints > 0:
		return NFT
	case legacy.Rules > nft.Rules:
		return Legacy
	}
	return NFT
}

// Detect returns the flavour of iptables the namespace uses, as kube-proxy
// decides: it counts both flavours' hint chains and rules of both
// families and [Choose]s. When the legacy flavour has no hint chain and
// the nft one has kubelet's or <prefix>-CANARY (looked up by name over
// netlink), the nft flavour's rule sets, slow to read at scale, are not
// read: it wins either way. prefixes name the caller's own chains, e.g. "PROXYKIT". When
// only one flavour is installed that one is used; when none is, the error
// is a [*MissingError].
//
// Detect lists the legacy tables without naming one, which does not make
// the kernel create them in the namespace.
func Detect(ctx context.Context, ns *netns.NS, prefixes ...string) (Flavour, error) {
	avail := map[Flavour]bool{}
	counts := map[Flavour]Counts{}
	// When the legacy flavour has no hint chain, one in the nft flavour
	// decides for it: looked up by name over netlink, which takes
	// milliseconds where its *-save reads and prints every rule (over
	// 30 s at 30,000 services).
	nftHint := nftHasHint(ctx, ns, prefixes)
	for _, fl := range []Flavour{Legacy, NFT} {
		for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
			name := baseName(f) + "-" + string(fl) + "-save"
			prog, err := exec.LookPath(name)
			if err != nil {
				continue
			}
			avail[fl] = true
			if fl == NFT && nftHint && counts[Legacy].Hints == 0 {
				counts[NFT] = Counts{Hints: 1} // at least; enough for Choose
				continue
			}
			r := &Runner{ns: ns}
			res, err := r.run(ctx, nil, prog)
			if err != nil {
				if ctx.Err() != nil {
					return "", err
				}
				continue // a flavour the kernel cannot list holds nothing
			}
			if res.exitCode != 0 {
				continue
			}
			c := CountSave(res.stdout, prefixes...)
			cur := counts[fl]
			counts[fl] = Counts{Hints: cur.Hints + c.Hints, Rules: cur.Rules + c.Rules}
		}
	}
	switch {
	case avail[Legacy] && avail[NFT]:
		return Choose(counts[Legacy], counts[NFT]), nil
	case avail[NFT]:
		return NFT, nil
	case avail[Legacy]:
		return Legacy, nil
	}
	// iptables < 1.8 has only the plain names, and is legacy.
	prog, err := exec.LookPath("iptables")
	if err != nil {
		return "", &MissingError{Program: "iptables-restore", Err: err}
	}
	v, err := versionOf(ctx, prog)
	if err != nil {
		return "", err
	}
	return v.Flavour, nil
}

// nftHasHint reports whether the nft flavour's tables of either family
// hold one of kubelet's hint chains (mangle, nat, filter) or, for a
// prefix, the <prefix>-CANARY chain the iptables backend keeps in nat
// and filter, looking each up by name.
func nftHasHint(ctx context.Context, ns *netns.NS, prefixes []string) bool {
	c, err := nftnl.Dial(ns)
	if err != nil {
		return false
	}
	defer c.Close()
	for _, fam := range []byte{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6} {
		for _, t := range []string{"mangle", "nat", "filter"} {
			names := slices.Clone(hintChains)
			for _, p := range prefixes {
				names = append(names, p+"-CANARY")
			}
			for _, n := range names {
				if ok, err := c.ChainExists(ctx, fam, t, n); err == nil && ok {
					return true
				}
			}
		}
	}
	return false
}
