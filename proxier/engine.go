package proxier

import "errors"

// New returns a Proxier that drives the given backends, one per IP family.
// Backend packages call it from their own New.
func New(cfg Config, backends ...Backend) (Proxier, error) {
	return nil, errors.New("engine: not implemented yet")
}
