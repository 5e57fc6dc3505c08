package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

func init() {
	register("list", "list your jobs, newest first (filter by --status, --tag, --since)", cmdList)
	register("cancel", "cancel jobs by id", cmdCancel)
	register("runtimes", "list the runtimes the fleet offers, with image digests and limits", cmdRuntimes)
}

// cmdList lists the caller's jobs a page at a time (--all: every page).
func cmdList(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln list", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kiln list [flags]\n\nLists your jobs still recorded, newest first: id, status, runtime, creation time, exit\ncode, metadata. More than a page: --cursor (printed on stderr) or --all.")
		fs.PrintDefaults()
	}
	var cf clientFlags
	cf.register(fs)
	var f client.JobFilter
	var tags metadataFlags
	status := fs.String("status", "", "only jobs of this status ("+statusNames()+")")
	fs.Var(&tags, "tag", "KEY=VALUE: only jobs whose metadata holds it; repeatable (all must hold)")
	since := fs.Duration("since", 0, "only jobs created within this long (e.g. 1h)")
	after := fs.String("after", "", "only jobs created after this time (RFC 3339)")
	before := fs.String("before", "", "only jobs created before this time (RFC 3339)")
	fs.IntVar(&f.Limit, "limit", job.ListPageDefault, fmt.Sprintf("jobs per page (at most %d)", job.ListPageMax))
	fs.StringVar(&f.Cursor, "cursor", "", "the page after this cursor (as a previous kiln list printed it)")
	all := fs.Bool("all", false, "read every page")
	asJSON := fs.Bool("json", false, "print the API's JSON pages")
	pos, err := parseWithPositional(fs, args)
	if err != nil {
		return clientUsageError(err)
	}
	if len(pos) != 0 {
		fs.Usage()
		return 2
	}
	f.Status, f.Tags = job.Status(*status), job.Metadata(tags)
	if *since > 0 {
		f.CreatedAfter = time.Now().Add(-*since)
	}
	for _, t := range []struct {
		flag string
		v    string
		dst  *time.Time
	}{{"after", *after, &f.CreatedAfter}, {"before", *before, &f.CreatedBefore}} {
		if t.v == "" {
			continue
		}
		if *t.dst, err = time.Parse(time.RFC3339Nano, t.v); err != nil {
			fmt.Fprintf(os.Stderr, "kiln list: --%s %q is not an RFC 3339 time such as 2026-01-02T15:04:05Z\n", t.flag, t.v)
			return 2
		}
	}
	c, err := cf.client()
	if err != nil {
		return clientFail("list", err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	if !*asJSON {
		fmt.Fprintln(tw, "ID\tSTATUS\tRUNTIME\tCREATED\tEXIT\tMETADATA")
	}
	for {
		page, err := c.ListJobs(ctx, f)
		if err != nil {
			return clientFail("list", err)
		}
		if *asJSON {
			if code := printJobJSON(page); code != 0 {
				return code
			}
		} else {
			printSummaries(tw, page.Jobs)
		}
		if page.NextCursor == "" {
			break
		}
		if !*all {
			_ = tw.Flush()
			fmt.Fprintf(os.Stderr, "kiln list: more jobs: kiln list --cursor %s (with the same filters), or --all\n", page.NextCursor)
			break
		}
		f.Cursor = page.NextCursor
	}
	_ = tw.Flush()
	return 0
}

func printSummaries(w io.Writer, jobs []job.JobSummary) {
	for _, j := range jobs {
		exit := "-"
		if j.ExitCode != nil {
			exit = fmt.Sprint(*j.ExitCode)
		}
		md := metadataFlags(j.Metadata)
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.Status, j.Runtime, j.CreatedAt.UTC().Format(time.RFC3339), exit, md.String())
	}
}

func statusNames() string {
	var out []string
	for _, s := range job.Statuses {
		out = append(out, string(s))
	}
	return strings.Join(out, ", ")
}

// cmdCancel cancels each job named: a queued one is canceled at once, a
// running one asked to stop; one already finished is left as it is.
func cmdCancel(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln cancel", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kiln cancel ID... [flags]\n\nCancels each job: a queued one at once, a running one is asked to stop (--wait: until it has).")
		fs.PrintDefaults()
	}
	var cf clientFlags
	cf.register(fs)
	wait := fs.Bool("wait", false, "wait until each job has stopped")
	pos, err := parseWithPositional(fs, args)
	if err != nil {
		return clientUsageError(err)
	}
	if len(pos) == 0 {
		fs.Usage()
		return 2
	}
	c, err := cf.client()
	if err != nil {
		return clientFail("cancel", err)
	}
	code := 0
	for _, id := range pos {
		v, err := c.Cancel(ctx, id)
		if err == nil && *wait && !v.Terminal() {
			v, err = c.Wait(ctx, id)
		}
		if err != nil {
			code = clientFail("cancel "+id, err)
			continue
		}
		switch {
		case v.Status == job.StatusCanceled:
			fmt.Printf("%s canceled\n", id)
		case v.Terminal():
			fmt.Printf("%s had already ended: %s\n", id, v.Status)
		default:
			fmt.Printf("%s %s: asked to stop\n", id, v.Status)
		}
	}
	return code
}

// cmdRuntimes lists the runtimes registered by the fleet.
func cmdRuntimes(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln runtimes", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	if _, err := parseWithPositional(fs, args); err != nil {
		return clientUsageError(err)
	}
	c, err := cf.client()
	if err != nil {
		return clientFail("runtimes", err)
	}
	rts, err := c.Runtimes(ctx)
	if err != nil {
		return clientFail("runtimes", err)
	}
	if *asJSON {
		return printJobJSON(map[string]any{"runtimes": rts})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tIMAGE\tDIGEST\tTIMEOUT\tMEMORY\tSESSIONS")
	for _, r := range rts {
		d := r.Limits.Default
		digest := r.Digest
		if len(digest) > 19 {
			digest = digest[:19]
		}
		sessions := "?" // a worker of an earlier version did not say
		if r.Sessions != nil {
			sessions = map[bool]string{true: "yes", false: "no"}[*r.Sessions]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s (max %s)\t%d MiB (max %d)\t%s\n", r.Name, r.Image, digest,
			time.Duration(d.TimeoutMS)*time.Millisecond, time.Duration(r.Limits.Max.TimeoutMS)*time.Millisecond, d.MemoryMB, r.Limits.Max.MemoryMB, sessions)
	}
	_ = tw.Flush()
	if len(rts) == 0 {
		fmt.Fprintln(os.Stderr, "kiln runtimes: no worker has registered a runtime (is a worker running?)")
	}
	return 0
}
