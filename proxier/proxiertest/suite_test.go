package proxiertest

import (
	"regexp"
	"testing"
)

func TestCaseNames(t *testing.T) {
	valid := regexp.MustCompile(`^[A-Z][A-Za-z0-9]*(-[A-Z][A-Za-z0-9]*)*$`)
	seen := map[string]bool{}
	for _, c := range cases {
		if !valid.MatchString(c.name) {
			t.Errorf("case name %q is not Words-Joined-By-Dashes", c.name)
		}
		if seen[c.name] {
			t.Errorf("duplicate case %q", c.name)
		}
		seen[c.name] = true
		if c.run == nil {
			t.Errorf("case %q has no run function", c.name)
		}
	}
	if len(Cases()) != len(cases) {
		t.Errorf("Cases() returns %d names for %d cases", len(Cases()), len(cases))
	}
}

func TestValidSkipKey(t *testing.T) {
	for k, want := range map[string]bool{
		"Hairpin":        true,
		"Hairpin/IPv4":   true,
		"Hairpin/IPv6":   true,
		"Hairpin/ipv6":   false,
		"Hairpin/":       false,
		"NoSuchCase":     false,
		"DualStack":      true,
		"":               false,
		"LoadSpread/All": false,
	} {
		if got := validSkipKey(k); got != want {
			t.Errorf("validSkipKey(%q) = %v, want %v", k, got, want)
		}
	}
}
