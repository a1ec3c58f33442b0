package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os/exec"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/model"
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
		return eachTable(ctx, node, tableName, func(famName string, tl *nftables.Table) error {
			fmt.Fprintf(w, "\nWhat nftables programmed in node1 (table %s %s, read back over netlink):\n", famName, tableName)
			printTable(w, tl, name)
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
		return eachTable(ctx, node, tableName, func(famName string, tl *nftables.Table) error {
			text, err := node.Exec(ctx, "nft", "list", "table", famName, tableName)
			if err != nil {
				why := firstLine(err.Error())
				if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
					why = ee.String()
				}
				fmt.Fprintf(w, "\n(`nft list table %s %s` failed: %s. Reading the table over netlink instead.)\n", famName, tableName, why)
				fmt.Fprintf(w, "\nWhat nftables programmed in node1 (table %s %s, read back over netlink):\n", famName, tableName)
				printTable(w, tl, name)
				return nil
			}
			fmt.Fprintf(w, "\nWhat nftables programmed in node1 (`nft list table %s %s`, empty sets left out):\n", famName, tableName)
			printNftText(w, text)
			return nil
		})
	}
}

// eachTable calls fn with each of node's tables called tableName that
// holds a service, read back by the backend's [nftables.ReadTable].
func eachTable(ctx context.Context, node *sandbox.Node, tableName string, fn func(famName string, tl *nftables.Table) error) error {
	for _, fam := range []model.IPFamily{model.IPv4, model.IPv6} {
		tl, err := nftables.ReadTable(ctx, node.NetNSPath(), fam, tableName)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if !hasServices(tl) {
			continue
		}
		famName := "ip"
		if fam == model.IPv6 {
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

// elements returns the elements of the table's set called name.
func elements(tl *nftables.Table, name string) []nftables.Element {
	for _, s := range tl.Sets {
		if s.Name == name {
			return s.Elements
		}
	}
	return nil
}

func hasServices(tl *nftables.Table) bool {
	return len(elements(tl, "service-ips")) > 0 || len(elements(tl, "no-endpoint-services")) > 0
}

// printTable writes the table: each service address of the dispatch maps
// with where its packets go, the other sets in use, and a line for the
// rest.
func printTable(w io.Writer, tl *nftables.Table, name func(netip.Addr) string) {
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
		var lines []string
		for _, r := range tl.Routes {
			if r.Map != m.set {
				continue
			}
			line := fmt.Sprintf("    %-22s %s", r.Key, r.Verdict)
			if r.Chain != "" {
				var parts []string
				if len(r.Endpoints) > 0 {
					parts = append(parts, "→ "+epNames(r.Endpoints))
				}
				if len(r.SomeSources) > 0 {
					parts = append(parts, "(some sources: "+epNames(r.SomeSources)+")")
				}
				if r.Affinity {
					a := "(session affinity"
					if len(r.Remembered) > 0 {
						p := make([]string, len(r.Remembered))
						for i, pn := range r.Remembered {
							p[i] = fmt.Sprintf("%s→%s:%d", name(pn.Client), name(pn.Endpoint.Addr()), pn.Endpoint.Port())
						}
						a += "; remembered: " + strings.Join(p, ", ")
					}
					parts = append(parts, a+")")
				}
				parts = append(parts, r.Verdicts...)
				if rest := strings.Join(parts, " "); len(line)+len(rest) < 118 {
					line = fmt.Sprintf("%-58s %s", line, rest)
				} else {
					line += "\n" + wrapLine("      "+rest, 8, 110)
				}
			}
			lines = append(lines, line)
		}
		if len(lines) == 0 {
			continue
		}
		fmt.Fprintln(w, "  "+m.title)
		slices.Sort(lines)
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}
	for _, n := range []string{"no-endpoint-services", "no-endpoint-nodeports", "cluster-ips", "cluster-cidrs", "nodeport-ips", "firewall-ips", "hairpin"} {
		i := slices.IndexFunc(tl.Sets, func(s nftables.Set) bool { return s.Name == n })
		if i < 0 || len(tl.Sets[i].Elements) == 0 {
			continue
		}
		lines := formatElems(tl.Sets[i])
		fmt.Fprintf(w, "  %-21s %s\n", n+":", lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(w, "  %-21s %s\n", "", l)
		}
	}
	var hooked []string
	for _, ch := range tl.Chains {
		if ch.Hook != "" {
			hooked = append(hooked, fmt.Sprintf("%s (%s %d)", ch.Name, ch.Hook, ch.Priority))
		}
	}
	used := 0
	for _, s := range tl.Sets {
		if len(s.Elements) > 0 {
			used++
		}
	}
	fmt.Fprintf(w, "  %-21s %s\n", "base chains:", wrap(hooked, 24, 100))
	fmt.Fprintf(w, "  %-21s %d chains; %d sets and maps, %d of them in use\n", "besides:", len(tl.Chains)-len(hooked), len(tl.Sets), used)
}

// formatElems formats a set's elements: the ranges of an interval set
// on one line, a map's elements one per line, a set's several per line.
func formatElems(s nftables.Set) []string {
	var out []string
	for _, e := range s.Elements {
		k := e.Key
		if s.DataType != "" {
			k += " → " + e.Data
		}
		out = append(out, k)
	}
	if s.Interval {
		return []string{strings.Join(out, ", ")}
	}
	slices.Sort(out)
	if s.DataType == "" {
		return strings.Split(wrap(out, 0, 76), "\n")
	}
	return out
}

// wrap joins items with ", ", breaking lines before width and indenting
// continuation lines by indent.
func wrap(items []string, indent, width int) string {
	var b strings.Builder
	col := indent
	for i, it := range items {
		if i > 0 {
			b.WriteString(",")
			col++
			if col+1+len(it) > width {
				b.WriteString("\n" + strings.Repeat(" ", indent))
				col = indent
			} else {
				b.WriteString(" ")
				col++
			}
		}
		b.WriteString(it)
		col += len(it)
	}
	return b.String()
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
