package badger

import (
	"cmp"
	"path/filepath"
	"slices"
	"time"
)

// Badger reads and writes its value logs and reads its tables through memory mappings, and a
// page of a mapping once touched counts in the process's resident set until the kernel needs it
// back: a 107 MB batch input left over 300 MiB of value-log pages resident after its run, though
// the gateway's heap held 60 MiB (docs/backends.md, "Badger's memory"). The pages are the page
// cache's, clean once written back, so nothing requires them mapped; paging them out keeps the
// resident set bounded by Badger's settings rather than by what the database ever held. A value
// log other than the newest is never written again, nor is a table, so together they keep at
// most residentSlack resident; the newest value log is bounded by value_log_file_size, the
// memtables' logs by memtables x memtable_size.

// residentCheck is how often the page-outs look: the mapped files are paged out as soon as
// residentGrowth bytes of files were written or read through the value logs since they last
// were (the store counts them: a batch's upload, its input read, its output's download), or the
// process's resident set (one line of /proc/self/statm) has grown residentGrowth, and every
// residentEvery whatever happened (the value-log GC, compactions), so a file read or written
// through at disk speed leaves about residentGrowth behind, not a second's worth. The count is
// what decides for files: the resident set is the whole process's, and the heap it also holds
// shrinks as it grows, hiding the pages.
const (
	residentCheck  = 100 * time.Millisecond
	residentGrowth = 16 << 20
	residentEvery  = time.Second
)

// residentSlack is what the older value logs and the tables may keep resident between them: the
// values and blocks read often (records replayed, lines about to run) stay, a file read or
// written through does not.
const residentSlack = 4 << 20

// keepResident pages out the database's older value logs and its tables (pageOutFiles) when the
// resident set has grown residentGrowth and every `every` (0: residentEvery; below 0: never),
// until the database closes.
func (sh *shared) keepResident(every time.Duration) {
	defer close(sh.residentDone)
	if every < 0 {
		<-sh.stopGC
		return
	}
	if every == 0 {
		every = residentEvery
	}
	t := time.NewTicker(min(residentCheck, every))
	defer t.Stop()
	last, lastRSS, lastThrough := time.Now(), int64(0), int64(0)
	for {
		select {
		case <-sh.stopGC:
			return
		case <-t.C:
		}
		through := sh.through.Load()
		rss, err := residentBytes()
		if through-lastThrough < residentGrowth && (err != nil || rss-lastRSS < residentGrowth) && time.Since(last) < every {
			continue
		}
		sh.pageOutFiles()
		last, lastThrough = time.Now(), through
		if rss, err = residentBytes(); err == nil {
			lastRSS = rss
		}
	}
}

// pageOutFiles pages out the mapped tables and value logs but the newest, the most resident
// first, until what they keep resident is at most residentSlack, and returns the bytes it asked
// the kernel to page out.
func (sh *shared) pageOutFiles() int64 {
	maps, err := mappedFiles(sh.dir)
	if err != nil || len(maps) == 0 {
		return 0
	}
	newest := ""
	for _, m := range maps {
		if filepath.Ext(m.path) == ".vlog" && m.path > newest { // Badger numbers them in order: 000001.vlog, ...
			newest = m.path
		}
	}
	var done []mapping
	var total int64
	for _, m := range maps {
		if ext := filepath.Ext(m.path); (ext == ".vlog" && m.path != newest) || ext == ".sst" {
			done = append(done, m)
			total += m.resident
		}
	}
	slices.SortFunc(done, func(a, b mapping) int { return cmp.Compare(b.resident, a.resident) })
	var out int64
	for _, m := range done {
		if total <= residentSlack || m.resident == 0 {
			break
		}
		if pageOut(m) == nil {
			out += m.resident
			total -= m.resident
		}
	}
	return out
}

// mapping is one memory mapping of a database file, and how much of it is resident.
type mapping struct {
	start, end uintptr
	path       string
	resident   int64
}
