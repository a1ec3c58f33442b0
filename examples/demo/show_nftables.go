package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/sandbox"
)

// showNftables prints the backend's tables in the node's namespace as
// netlink reads them back, decoded: the service addresses of the dispatch
// maps and the endpoints their packets may be DNATed to. Only tables that
// hold a service are shown.
func showNftables(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error {
	return showNftTable(nftables.DefaultTableName)(ctx, w, node, name)
}

// showNftTable returns the lister of showNftables for the tables called
// tableName.
func showNftTable(tableName string) lister {
	return func(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error {
		return eachTable(node, tableName, func(famName string, tl *table) error {
			fmt.Fprintf(w, "\nWhat nftables programmed in node1 (table %s %s, read back over netlink):\n", famName, tableName)
			tl.print(w, name)
			if _, err := exec.LookPath("nft"); err == nil {
				fmt.Fprintf(w, "  (all of it: --nft; or with --keep, sudo ip netns exec %s nft list table %s %s)\n", node.NetNSName(), famName, tableName)
			}
			return nil
		})
	}
}

// rawNftables prints `nft list table` of the backend's tables that hold a
// service, leaving out empty sets. When nft is missing or fails (1.0.6
// aborted on the backend's earlier session-affinity rules), it prints the
// decoded summary instead.
func rawNftables(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error {
	return rawNftTable(nftables.DefaultTableName)(ctx, w, node, name)
}

// rawNftTable returns the lister of rawNftables for the tables called
// tableName.
func rawNftTable(tableName string) lister {
	return func(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error {
		if _, err := exec.LookPath("nft"); err != nil {
			fmt.Fprintln(w, "\n(the nft program is not installed; reading the table over netlink instead)")
			return showNftTable(tableName)(ctx, w, node, name)
		}
		return eachTable(node, tableName, func(famName string, tl *table) error {
			text, err := node.Exec(ctx, "nft", "list", "table", famName, tableName)
			if err != nil {
				why := firstLine(err.Error())
				if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
					why = ee.String()
				}
				fmt.Fprintf(w, "\n(`nft list table %s %s` failed: %s. Reading the table over netlink instead.)\n", famName, tableName, why)
				fmt.Fprintf(w, "\nWhat nftables programmed in node1 (table %s %s, read back over netlink):\n", famName, tableName)
				tl.print(w, name)
				return nil
			}
			fmt.Fprintf(w, "\nWhat nftables programmed in node1 (`nft list table %s %s`, empty sets left out):\n", famName, tableName)
			printNftText(w, text)
			return nil
		})
	}
}

// eachTable calls fn with each of node's tables called tableName that
// holds a service.
func eachTable(node *sandbox.Node, tableName string, fn func(famName string, tl *table) error) error {
	fd, err := os.Open(node.NetNSPath())
	if err != nil {
		return err
	}
	defer fd.Close()
	c, err := gnft.New(gnft.WithNetNSFd(int(fd.Fd())))
	if err != nil {
		return err
	}
	for _, fam := range []gnft.TableFamily{gnft.TableFamilyIPv4, gnft.TableFamilyIPv6} {
		tl, err := readTable(c, fam, tableName)
		if err != nil {
			return err
		}
		if tl == nil || !tl.hasServices() {
			continue
		}
		famName := "ip"
		if fam == gnft.TableFamilyIPv6 {
			famName = "ip6"
		}
		if err := fn(famName, tl); err != nil {
			return err
		}
	}
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// printNftText copies nft's listing, leaving out sets and maps without
// elements.
func printNftText(w io.Writer, text string) {
	var block []string
	inSet := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		trim := strings.TrimSpace(line)
		if !inSet && (strings.HasPrefix(trim, "set ") || strings.HasPrefix(trim, "map ")) && strings.HasSuffix(trim, "{") {
			inSet, block = true, []string{line}
			continue
		}
		if inSet {
			block = append(block, line)
			if trim == "}" {
				inSet = false
				if slices.ContainsFunc(block, func(l string) bool { return strings.Contains(l, "elements = ") }) {
					for _, l := range block {
						fmt.Fprintln(w, "  "+l)
					}
				}
			}
			continue
		}
		if trim != "" {
			fmt.Fprintln(w, "  "+line)
		}
	}
}

// table is what netlink reads back of one of the backend's tables.
type table struct {
	t      *gnft.Table
	chains []*gnft.Chain
	rules  map[string][]*gnft.Rule
	sets   []*gnft.Set
	elems  map[string][]gnft.SetElement
	err    map[string]error // chains whose rules could not be read
}

// readTable reads the table, or returns nil when it does not exist.
func readTable(c *gnft.Conn, fam gnft.TableFamily, name string) (*table, error) {
	t, err := c.ListTableOfFamily(name, fam)
	if err != nil {
		return nil, nil // no such table
	}
	tl := &table{t: t, rules: map[string][]*gnft.Rule{}, elems: map[string][]gnft.SetElement{}, err: map[string]error{}}
	chains, err := c.ListChainsOfTableFamily(fam)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != name {
			continue
		}
		tl.chains = append(tl.chains, ch)
		rules, err := c.GetRules(t, ch)
		if err != nil {
			tl.err[ch.Name] = err
			continue
		}
		tl.rules[ch.Name] = rules
	}
	if tl.sets, err = c.GetSets(t); err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	for _, s := range tl.sets {
		el, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("list set %s: %w", s.Name, err)
		}
		tl.elems[s.Name] = el
	}
	return tl, nil
}

func (tl *table) hasServices() bool {
	return len(tl.elems["service-ips"]) > 0 || len(tl.elems["no-endpoint-services"]) > 0
}

// print writes the table: each service address of the dispatch maps with
// where its packets go, the other sets in use, and a line for the rest.
func (tl *table) print(w io.Writer, name func(netip.Addr) string) {
	td := tl.data()
	epNames := func(eps []netip.AddrPort) string {
		s := make([]string, len(eps))
		for i, ep := range eps {
			s[i] = fmt.Sprintf("%s:%d", name(ep.Addr()), ep.Port())
		}
		return strings.Join(s, ", ")
	}
	for _, m := range []struct{ set, title string }{
		{"service-ips", "service addresses (map service-ips) and where their packets go:"},
		{"service-nodeports", "node ports (map service-nodeports):"},
	} {
		s := td.sets[m.set]
		if s == nil || len(td.elems[m.set]) == 0 {
			continue
		}
		fmt.Fprintln(w, "  "+m.title)
		types := td.keyTypes(s)
		var lines []string
		for _, el := range td.elems[m.set] {
			v := elemVerdict(s, el)
			if v == nil {
				continue
			}
			line := fmt.Sprintf("    %-22s %s", formatValue(types, el.Key), formatVerdict(v))
			if v.Kind == expr.VerdictGoto || v.Kind == expr.VerdictJump {
				o := td.follow(v.Chain, td.flowOf(m.set, el.Key))
				var parts []string
				if len(o.endpoints) > 0 {
					parts = append(parts, "→ "+epNames(o.endpoints))
				}
				if len(o.some) > 0 {
					parts = append(parts, "(some sources: "+epNames(o.some)+")")
				}
				if o.affinity {
					a := "(session affinity"
					if len(o.pins) > 0 {
						p := make([]string, len(o.pins))
						for i, pn := range o.pins {
							p[i] = fmt.Sprintf("%s→%s:%d", name(pn.client), name(pn.endpoint.Addr()), pn.endpoint.Port())
						}
						a += "; remembered: " + strings.Join(p, ", ")
					}
					parts = append(parts, a+")")
				}
				parts = append(parts, o.verdicts...)
				if rest := strings.Join(parts, " "); len(line)+len(rest) < 118 {
					line = fmt.Sprintf("%-58s %s", line, rest)
				} else {
					line += "\n" + wrapLine("      "+rest, 8, 110)
				}
			}
			lines = append(lines, line)
		}
		slices.Sort(lines)
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}
	for _, n := range []string{"no-endpoint-services", "no-endpoint-nodeports", "cluster-ips", "cluster-cidrs", "nodeport-ips", "firewall-ips", "hairpin"} {
		s := td.sets[n]
		if s == nil || len(td.elems[n]) == 0 {
			continue
		}
		lines := formatElems(s, td.keyTypes(s), td.elems[n])
		fmt.Fprintf(w, "  %-21s %s\n", n+":", lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(w, "  %-21s %s\n", "", l)
		}
	}
	var hooked []string
	for _, ch := range tl.chains {
		if ch.Hooknum != nil && ch.Priority != nil {
			hooked = append(hooked, fmt.Sprintf("%s (%s %d)", ch.Name, hookName(*ch.Hooknum), *ch.Priority))
		}
	}
	used := 0
	for _, s := range tl.sets {
		if len(tl.elems[s.Name]) > 0 {
			used++
		}
	}
	fmt.Fprintf(w, "  %-21s %s\n", "base chains:", wrap(hooked, 24, 100))
	fmt.Fprintf(w, "  %-21s %d chains; %d sets and maps, %d of them in use\n", "besides:", len(tl.chains)-len(hooked), len(tl.sets), used)
	if len(tl.err) > 0 {
		fmt.Fprintf(w, "  (the rules of %d chains could not be read)\n", len(tl.err))
	}
}

// wrapLine breaks a line longer than width at the last ", " or " ("
// before width, indenting the rest by indent.
func wrapLine(l string, indent, width int) string {
	var b strings.Builder
	for len(l) > width {
		cut := max(strings.LastIndex(l[:width], ", "), strings.LastIndex(l[:width], " ("))
		if cut <= indent {
			break
		}
		if l[cut] == ',' {
			cut++
		}
		b.WriteString(l[:cut] + "\n")
		l = strings.Repeat(" ", indent) + strings.TrimLeft(l[cut:], " ")
	}
	b.WriteString(l)
	return b.String()
}

// data returns the table in the form the evaluator takes.
func (tl *table) data() *tableData {
	td := &tableData{addrLen: 4, family: unix.NFPROTO_IPV4, rules: tl.rules, sets: map[string]*gnft.Set{}, elems: tl.elems}
	if tl.t.Family == gnft.TableFamilyIPv6 {
		td.addrLen, td.family = 16, unix.NFPROTO_IPV6
	}
	for _, s := range tl.sets {
		td.sets[s.Name] = s
	}
	return td
}

// flowOf returns the packet a dispatch map's key stands for: address .
// protocol . port, or protocol . port for node ports (any node address).
func (td *tableData) flowOf(set string, key []byte) flow {
	var f flow
	if set == "service-ips" && len(key) >= td.addrLen+8 {
		f.daddr, key = key[:td.addrLen], key[td.addrLen:]
	}
	if len(key) >= 8 {
		f.proto, f.dport = key[0], binary.BigEndian.Uint16(key[4:])
	}
	return f
}

// keyTypes returns the types of a set's key. google/nftables v0.3.0
// reports the key type of a verdict map as "verdict", so those of the
// backend's verdict maps come from its documented layout (README.md).
func (td *tableData) keyTypes(s *gnft.Set) []gnft.SetDatatype {
	addr := gnft.TypeIPAddr
	if td.addrLen == 16 {
		addr = gnft.TypeIP6Addr
	}
	switch s.Name {
	case "service-ips", "no-endpoint-services", "firewall-ips":
		return []gnft.SetDatatype{addr, gnft.TypeInetProto, gnft.TypeInetService}
	case "service-nodeports", "no-endpoint-nodeports":
		return []gnft.SetDatatype{gnft.TypeInetProto, gnft.TypeInetService}
	}
	if t := gnft.ConcatSetTypeElements(s.KeyType); len(t) > 0 && t[0].Bytes > 0 {
		return t
	}
	return []gnft.SetDatatype{s.KeyType}
}
