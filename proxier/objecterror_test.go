package proxier

import (
	"errors"
	"fmt"
	"testing"

	"github.com/proxykit/proxykit/model"
)

func TestJoinObjectErrors(t *testing.T) {
	name := func(n string) model.ServicePortName {
		return model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: n}, Protocol: model.TCP}
	}
	if err := JoinObjectErrors(nil, map[model.ServicePortName]error{name("a"): nil}); err != nil {
		t.Fatalf("no errors joined into %v", err)
	}
	err := JoinObjectErrors(
		map[model.ServicePortName]error{name("c"): errors.New("bad c"), name("a"): errors.New("bad a"), name("x"): nil},
		map[model.ServicePortName]error{name("b"): errors.New("bad b")},
	)
	if got, want := err.Error(), "ns/a/TCP: bad a\nns/c/TCP: bad c\nns/b/TCP: bad b"; got != want {
		t.Errorf("joined %q, want %q (sorted per map, nil left out)", got, want)
	}
	if !OnlyObjectErrors(err) || !OnlyObjectErrors(nil) {
		t.Error("object errors (or none) not recognised")
	}
	if !OnlyObjectErrors(errors.Join(err, errors.Join(&ObjectError{Service: name("d"), Err: errors.New("d")}))) {
		t.Error("nested joins of object errors not recognised")
	}
	for _, e := range []error{
		errors.New("kernel"),
		errors.Join(err, errors.New("kernel")),
		fmt.Errorf("wrapped: %w", &ObjectError{Service: name("a"), Err: errors.New("a")}),
	} {
		if OnlyObjectErrors(e) {
			t.Errorf("%q taken for object errors only", e)
		}
	}
}
