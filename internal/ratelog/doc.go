// Package ratelog limits how often a log message is written, so a flood of
// bad objects (every Service of a broken controller, say) cannot flood the
// log. Records are grouped by message text and level: each group may write
// a burst of records per interval; the rest are counted and reported once,
// as a "suppressed" count on the group's next written record.
package ratelog
