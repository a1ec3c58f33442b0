package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/proxykit/proxykit/model"
)

// state is what the kernel holds as of the last successful sync, kept in
// memory so that an incremental sync never reads the kernel.
type state struct {
	services map[model.ServicePortName]*svcObjs
	// vs holds every virtual server and the service port that owns it.
	vs    map[vsKey]*vsSpec
	owner map[vsKey]model.ServicePortName
	// addrs and elems count the service ports using each address on
	// the dummy interface and each set element.
	addrs map[netip.Addr]int
	elems map[elem]int
	// nodeAddrs are the node addresses node ports were opened on.
	nodeAddrs []netip.Addr
}

func newState() *state {
	return &state{
		services: map[model.ServicePortName]*svcObjs{},
		vs:       map[vsKey]*vsSpec{},
		owner:    map[vsKey]model.ServicePortName{},
		addrs:    map[netip.Addr]int{},
		elems:    map[elem]int{},
	}
}

// change is the difference between two states, in the order it is
// applied: additions first, removals last.
type change struct {
	addElems   []elem
	newVS      []*vsSpec    // create with their real servers
	updateVS   [][2]*vsSpec // old, new: service options or real servers differ
	addAddrs   []netip.Addr // bind on the dummy interface
	delAddrs   []netip.Addr // unbind
	delVS      []*vsSpec    // delete
	delElems   []elem       // remove from the sets
	objErrs    map[model.ServicePortName]error
	replaced   map[model.ServicePortName]bool // ports whose objects changed
	nodeChange bool
}

func (c *change) empty() bool {
	return len(c.addElems)+len(c.newVS)+len(c.updateVS)+len(c.addAddrs)+len(c.delAddrs)+len(c.delVS)+len(c.delElems) == 0
}

// set replaces the objects of one service port (nil: deletes them) in st,
// and records the difference in c. It fails, changing nothing, when
// another service port owns one of the virtual servers.
func (st *state) set(name model.ServicePortName, objs *svcObjs, c *change) error {
	if objs != nil {
		for i := range objs.VS {
			k := objs.VS[i].Key
			if o, ok := st.owner[k]; ok && o != name {
				return fmt.Errorf("%s is already a virtual server of %s", k, o)
			}
		}
	}
	old := st.services[name]
	if old == nil && objs == nil {
		return nil
	}
	// Virtual servers.
	oldVS := map[vsKey]*vsSpec{}
	if old != nil {
		for i := range old.VS {
			oldVS[old.VS[i].Key] = &old.VS[i]
		}
	}
	if objs != nil {
		for i := range objs.VS {
			n := &objs.VS[i]
			n.Owner = name
			st.vs[n.Key], st.owner[n.Key] = n, name
			o := oldVS[n.Key]
			delete(oldVS, n.Key)
			switch {
			case o == nil:
				c.newVS = append(c.newVS, n)
			case !o.sameService(n) || !slices.Equal(o.Dests, n.Dests):
				c.updateVS = append(c.updateVS, [2]*vsSpec{o, n})
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(oldVS), compareKeys) {
		c.delVS = append(c.delVS, oldVS[k])
		delete(st.vs, k)
		delete(st.owner, k)
	}
	// Reference-counted addresses and elements.
	if old != nil {
		for _, a := range old.Addrs {
			if st.addrs[a]--; st.addrs[a] <= 0 {
				delete(st.addrs, a)
				c.delAddrs = append(c.delAddrs, a)
			}
		}
		for _, e := range old.Elems {
			if st.elems[e]--; st.elems[e] <= 0 {
				delete(st.elems, e)
				c.delElems = append(c.delElems, e)
			}
		}
	}
	if objs != nil {
		for _, a := range objs.Addrs {
			if st.addrs[a]++; st.addrs[a] == 1 {
				if i := slices.Index(c.delAddrs, a); i >= 0 {
					c.delAddrs = slices.Delete(c.delAddrs, i, i+1)
				} else {
					c.addAddrs = append(c.addAddrs, a)
				}
			}
		}
		for _, e := range objs.Elems {
			if st.elems[e]++; st.elems[e] == 1 {
				if i := slices.Index(c.delElems, e); i >= 0 {
					c.delElems = slices.Delete(c.delElems, i, i+1)
				} else {
					c.addElems = append(c.addElems, e)
				}
			}
		}
		st.services[name] = objs
	} else {
		delete(st.services, name)
	}
	if c.replaced == nil {
		c.replaced = map[model.ServicePortName]bool{}
	}
	c.replaced[name] = true
	return nil
}

// normalize removes from c what cancels out across service ports: an
// address or element released by one port and taken by another in the
// same sync, and a virtual server deleted by one port and created by
// another (which becomes an update).
func (c *change) normalize() {
	del := map[netip.Addr]bool{}
	for _, a := range c.delAddrs {
		del[a] = true
	}
	var adds []netip.Addr
	for _, a := range c.addAddrs {
		if del[a] {
			delete(del, a)
			continue
		}
		adds = append(adds, a)
	}
	c.addAddrs = adds
	c.delAddrs = slices.DeleteFunc(c.delAddrs, func(a netip.Addr) bool { return !del[a] })

	delE := map[elem]bool{}
	for _, e := range c.delElems {
		delE[e] = true
	}
	var addE []elem
	for _, e := range c.addElems {
		if delE[e] {
			delete(delE, e)
			continue
		}
		addE = append(addE, e)
	}
	c.addElems = addE
	c.delElems = slices.DeleteFunc(c.delElems, func(e elem) bool { return !delE[e] })

	delV := map[vsKey]*vsSpec{}
	for _, v := range c.delVS {
		delV[v.Key] = v
	}
	var newV []*vsSpec
	for _, n := range c.newVS {
		if o := delV[n.Key]; o != nil {
			delete(delV, n.Key)
			if !o.sameService(n) || !slices.Equal(o.Dests, n.Dests) {
				c.updateVS = append(c.updateVS, [2]*vsSpec{o, n})
			}
			continue
		}
		newV = append(newV, n)
	}
	c.newVS = newV
	c.delVS = slices.DeleteFunc(c.delVS, func(v *vsSpec) bool { return delV[v.Key] == nil })
}
