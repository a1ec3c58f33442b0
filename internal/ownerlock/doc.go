// Package ownerlock keeps two proxiers from programming one dataplane
// object, such as a backend's table in a network namespace, at the same
// time. Without it the second proxier silently takes the object over and
// the first one's services die without a log line.
//
// A lock is an flock(2) on a file under [Dir], named after the namespace
// (device and inode, so that every path to one namespace meets the same
// lock) and the object. The kernel releases it when its holder closes it
// or ends, however it ends, so a killed proxier never blocks its
// successor. Two locks in one process conflict as well. A lock is
// refused after [heldGrace] of trying, so a real conflict is reported
// that much later.
package ownerlock
