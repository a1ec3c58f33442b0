package fakeproxier_test

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/proxier/fakeproxier"
)

// Events records what a source or controller delivers, for tests that
// need neither a dataplane nor root.
func ExampleEvents() {
	p := &fakeproxier.Events{}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}}
	p.OnServiceAdd(svc)
	p.OnServiceUpdate(svc, svc)
	p.OnServiceSynced()
	fmt.Println(p.Take())
	fmt.Println(p.Has("svc+ web"), len(p.Lines()))
	// Output:
	// [svc+ web svc~ web svc synced]
	// false 0
}
