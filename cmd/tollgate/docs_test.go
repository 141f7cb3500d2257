package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// repoRoot is where README.md lives, seen from this package's directory.
const repoRoot = "../.."

// docFiles are the documents whose commands, flags and links are checked:
// the README, the architecture and every page under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "ARCHITECTURE.md", "BENCHMARKS.md",
		"deployments/README.md", "deployments/kubernetes/README.md", "deployments/observability/README.md"}
	more, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		rel, err := filepath.Rel(repoRoot, m)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, rel)
	}
	if len(more) == 0 {
		t.Fatal("no docs/*.md found: is repoRoot right?")
	}
	return files
}

// cliTree is the real command tree, with what cobra adds only at Execute
// (help, completion, --help, --version) added, so the docs may name them.
func cliTree() *cobra.Command {
	root := newRootCmd()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	root.InitDefaultVersionFlag()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.InitDefaultHelpFlag()
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return root
}

// allFlags is every long flag of any command: a flag named in prose, without
// its command, must at least be one of these.
func allFlags(root *cobra.Command) map[string]bool {
	all := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		add := func(f *pflag.Flag) { all[f.Name] = true }
		c.Flags().VisitAll(add)
		c.PersistentFlags().VisitAll(add)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return all
}

// knownFlag is a long flag some command has; "name*" is any flag so prefixed.
func knownFlag(all map[string]bool, name string) bool {
	prefix, ok := strings.CutSuffix(name, "*")
	if !ok {
		return all[name]
	}
	for f := range all {
		if strings.HasPrefix(f, prefix) {
			return true
		}
	}
	return false
}

// docLine is one line of a document as the checks see it: code (a fenced
// block's line, continuation lines joined) or prose with its inline code spans.
type docLine struct {
	file  string
	line  int
	code  bool
	text  string
	spans []string // inline `code` spans of a prose line
}

func (l docLine) where() string { return fmt.Sprintf("%s:%d", l.file, l.line) }

var inlineCode = regexp.MustCompile("`([^`]+)`")

func readDoc(t *testing.T, file string) (lines []docLine, raw []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, file))
	if err != nil {
		t.Fatal(err)
	}
	raw = strings.Split(string(b), "\n")
	inFence, output := false, false
	for i := 0; i < len(raw); i++ {
		l := raw[i]
		if fence := strings.TrimSpace(l); strings.HasPrefix(fence, "```") {
			inFence = !inFence
			// A ```text block is what a program printed, not commands.
			output = inFence && strings.TrimPrefix(fence, "```") == "text"
			continue
		}
		if inFence && output {
			continue
		}
		if inFence {
			start := i
			for strings.HasSuffix(l, "\\") && i+1 < len(raw) && !strings.HasPrefix(strings.TrimSpace(raw[i+1]), "```") {
				i++
				l = strings.TrimSuffix(l, "\\") + " " + raw[i]
			}
			lines = append(lines, docLine{file: file, line: start + 1, code: true, text: l})
			continue
		}
		dl := docLine{file: file, line: i + 1, text: l}
		for _, m := range inlineCode.FindAllStringSubmatch(l, -1) {
			dl.spans = append(dl.spans, m[1])
		}
		lines = append(lines, dl)
	}
	return lines, raw
}

// invocation finds "tollgate WORD…" in a piece of code: the binary's name
// (bare, ./bin/tollgate, /usr/local/bin/tollgate) followed by a space.
var invocation = regexp.MustCompile(`(?:^|[\s(=$"'])([./\w-]*/)?tollgate[ \t]+(.*)$`)

var (
	commandWord = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	alternates  = regexp.MustCompile(`^[a-z][a-z0-9-]*(?:[|/][a-z][a-z0-9-]*)+$`)
	longFlag    = regexp.MustCompile(`(?:^|[\s\[(|=,])--([a-z][a-z0-9-]*\*?)`)
	shortFlag   = regexp.MustCompile(`^[\[(]?-([a-zA-Z])\]?$`)
)

// shellEnd ends an invocation's arguments: what follows belongs to another
// command (a pipe, a list, a redirection, a comment).
func shellEnd(tok string) bool {
	switch tok {
	case "|", "||", "&&", ";", ">", ">>", "<", "2>&1", "#":
		return true
	}
	return strings.HasPrefix(tok, "#") || strings.HasPrefix(tok, ">")
}

// checkInvocation walks the words after "tollgate" down the command tree and
// checks every flag up to the end of the command against the command reached.
// It returns problems, each a sentence.
func checkInvocation(root *cobra.Command, args string) []string {
	// A table cell escapes "or" as \|: "query\|bill", "(--group G \| --all-groups)".
	args = strings.ReplaceAll(args, `\|`, "|")
	toks := strings.Fields(args)
	cmds := []*cobra.Command{root}
	var problems []string
	i := 0
	// Descend: each word that names a subcommand is one; alternatives
	// ("query|bill", "set/apply") must each be one, and the walk stops there.
	for ; i < len(toks); i++ {
		tok := strings.Trim(toks[i], "`'\",.:;)")
		if tok == "" {
			break
		}
		if alternates.MatchString(tok) && cmds[0].HasSubCommands() {
			var next []*cobra.Command
			for _, name := range strings.FieldsFunc(tok, func(r rune) bool { return r == '|' || r == '/' }) {
				if c := subcommand(cmds[0], name); c != nil {
					next = append(next, c)
				} else {
					problems = append(problems, fmt.Sprintf("%q has no subcommand %q", cmds[0].CommandPath(), name))
				}
			}
			if len(next) > 0 {
				cmds = next
			}
			i++
			break
		}
		if !commandWord.MatchString(tok) {
			break
		}
		c := subcommand(cmds[0], tok)
		if c == nil {
			// A word that is not a subcommand is an argument, unless the
			// command takes none of its own and only groups others.
			if cmds[0].HasSubCommands() && !cmds[0].Runnable() {
				problems = append(problems, fmt.Sprintf("%q has no subcommand %q", cmds[0].CommandPath(), tok))
			}
			break
		}
		cmds = []*cobra.Command{c}
	}
	for ; i < len(toks); i++ {
		tok := toks[i]
		if tok == "|" && i+1 < len(toks) && strings.HasPrefix(toks[i+1], "-") {
			continue // "--group G | --all-groups": a choice of flags, not a pipe
		}
		if shellEnd(tok) {
			break
		}
		for _, m := range longFlag.FindAllStringSubmatch(tok, -1) {
			if !anyHasFlag(cmds, m[1]) {
				problems = append(problems, fmt.Sprintf("%q has no flag --%s", cmds[0].CommandPath(), m[1]))
			}
		}
		if m := shortFlag.FindStringSubmatch(tok); m != nil {
			found := false
			for _, c := range cmds {
				if c.Flags().ShorthandLookup(m[1]) != nil || c.InheritedFlags().ShorthandLookup(m[1]) != nil {
					found = true
				}
			}
			if !found {
				problems = append(problems, fmt.Sprintf("%q has no flag -%s", cmds[0].CommandPath(), m[1]))
			}
		}
	}
	return problems
}

func subcommand(c *cobra.Command, name string) *cobra.Command {
	for _, sub := range c.Commands() {
		if sub.Name() == name || sub.HasAlias(name) {
			return sub
		}
	}
	return nil
}

func anyHasFlag(cmds []*cobra.Command, name string) bool {
	if prefix, ok := strings.CutSuffix(name, "*"); ok {
		// --tls-* names a family: some flag of the command starts so.
		for _, c := range cmds {
			found := false
			visit := func(f *pflag.Flag) { found = found || strings.HasPrefix(f.Name, prefix) }
			c.Flags().VisitAll(visit)
			c.InheritedFlags().VisitAll(visit)
			if found {
				return true
			}
		}
		return false
	}
	for _, c := range cmds {
		if c.Flags().Lookup(name) != nil || c.InheritedFlags().Lookup(name) != nil {
			return true
		}
	}
	return false
}

// otherTool says whether a piece of code runs another program first, whose
// flags are not Tollgate's (go test -run, curl -H, kubectl apply -k, …).
func otherTool(code string) bool {
	f := strings.Fields(code)
	for len(f) > 0 && (strings.Contains(f[0], "=") && !strings.HasPrefix(f[0], "-") || f[0] == "sudo") {
		f = f[1:] // leading VAR=value assignments
	}
	if len(f) == 0 {
		return false
	}
	switch strings.TrimPrefix(f[0], "$ ") {
	case "go", "curl", "kubectl", "docker", "docker-compose", "make", "git", "protoc", "openssl",
		"helm", "envoy", "sha256sum", "printf", "kill", "open", "cat", "scripts/cluster.sh",
		"./scripts/cluster.sh", "./scripts/demo.sh", "scripts/bench-cluster.sh", "scripts/bench-tls.sh",
		"scripts/rolling-restart.sh", "tee", "systemctl", "journalctl", "ls", "cp", "rm", "mv":
		return true
	}
	return false
}

// TestDocsCommandsAndFlagsExist: every `tollgate …` command line in the docs
// names commands that exist and, for each, only flags it has; every --flag
// named without its command is a flag of some command. A renamed or removed
// flag fails here, naming the file and line, until the docs follow.
func TestDocsCommandsAndFlagsExist(t *testing.T) {
	root := cliTree()
	flags := allFlags(root)
	invocations := 0
	for _, file := range docFiles(t) {
		lines, _ := readDoc(t, file)
		for _, l := range lines {
			var pieces []string
			if l.code {
				pieces = []string{l.text}
			} else {
				pieces = l.spans
			}
			for _, code := range pieces {
				// In another program's line ("kubectl -n tollgate …") only a
				// path to the binary ("… -- /tollgate status") is an invocation.
				if m := invocation.FindStringSubmatch(code); m != nil && (m[1] != "" || !otherTool(code)) {
					invocations++
					for _, p := range checkInvocation(root, m[2]) {
						t.Errorf("%s: %s (in %q)", l.where(), p, strings.TrimSpace(code))
					}
					continue
				}
				if otherTool(code) {
					continue
				}
				for _, m := range longFlag.FindAllStringSubmatch(code, -1) {
					if !knownFlag(flags, m[1]) {
						t.Errorf("%s: no command has a flag --%s (in %q)", l.where(), m[1], strings.TrimSpace(code))
					}
				}
			}
			if !l.code {
				// A flag in plain prose, outside code: the same rule.
				prose := inlineCode.ReplaceAllString(l.text, "")
				for _, m := range longFlag.FindAllStringSubmatch(prose, -1) {
					if !knownFlag(flags, m[1]) {
						t.Errorf("%s: no command has a flag --%s", l.where(), m[1])
					}
				}
			}
		}
	}
	if invocations < 20 {
		t.Fatalf("only %d tollgate command lines found in the docs: is the scanner broken?", invocations)
	}
}

// mdLink is [text](target) and ![alt](target); a target may carry a title.
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestDocsLinksResolve: every relative link in the docs points at a file or
// directory of the repository, and a #fragment at a heading of that page.
func TestDocsLinksResolve(t *testing.T) {
	anchorsOf := map[string]map[string]bool{}
	anchors := func(t *testing.T, file string) map[string]bool {
		if a, ok := anchorsOf[file]; ok {
			return a
		}
		_, raw := readDoc(t, file)
		a := headingAnchors(raw)
		anchorsOf[file] = a
		return a
	}
	links := 0
	for _, file := range docFiles(t) {
		lines, _ := readDoc(t, file)
		for _, l := range lines {
			if l.code {
				continue
			}
			text := inlineCode.ReplaceAllString(l.text, "")
			for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				path, frag, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Clean(filepath.Join(filepath.Dir(file), path))
					if _, err := os.Stat(filepath.Join(repoRoot, dest)); err != nil {
						t.Errorf("%s: link to %s: no such file", l.where(), target)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[frag] {
					t.Errorf("%s: link to %s: %s has no heading with anchor #%s", l.where(), target, dest, frag)
				}
			}
		}
	}
	if links < 10 {
		t.Fatalf("only %d relative links found: is the scanner broken?", links)
	}
}

// repoFile is a code span that names a source or document file of the
// repository by its path from the root (`fsm/snapfmt/format.md`,
// `server/rules.go`); a bare name or an absolute path is not one.
var repoFile = regexp.MustCompile(`^[a-z][\w.-]*(?:/[\w.-]+)+\.(?:go|md|proto|sh)$`)

// TestDocsFilesNamedExist: a file the docs name in code (`backup/format.md`)
// exists, so a moved or deleted file cannot leave the docs pointing at nothing.
func TestDocsFilesNamedExist(t *testing.T) {
	named := 0
	for _, file := range docFiles(t) {
		lines, _ := readDoc(t, file)
		for _, l := range lines {
			if l.code {
				continue
			}
			for _, span := range l.spans {
				path, _, _ := strings.Cut(span, ":") // `server/versions.go: expireAge`
				if !repoFile.MatchString(path) {
					continue
				}
				named++
				// From the root, or from the document's own directory.
				_, errRoot := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(path)))
				_, errHere := os.Stat(filepath.Join(repoRoot, filepath.Dir(file), filepath.FromSlash(path)))
				if errRoot != nil && errHere != nil {
					t.Errorf("%s: names %s, which does not exist", l.where(), path)
				}
			}
		}
	}
	if named < 20 {
		t.Fatalf("only %d file paths named in the docs: is the scanner broken?", named)
	}
}

// headingAnchors are the fragment ids GitHub gives a page's headings: lower
// case, punctuation dropped, spaces to hyphens, "-1", "-2"… for repeats.
func headingAnchors(raw []string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, l := range raw {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		id := b.String()
		if n := seen[id]; n > 0 {
			out[fmt.Sprintf("%s-%d", id, n)] = true
		} else {
			out[id] = true
		}
		seen[id]++
	}
	return out
}

// TestDocsCheckerCatchesMistakes: the scanner above fails on what it is for,
// so a docs test that passes means the docs are right, not the scanner blind.
func TestDocsCheckerCatchesMistakes(t *testing.T) {
	root := cliTree()
	cases := []struct {
		args string
		bad  bool
	}{
		{"status --json", false},
		{"limits set --tenant acme max_series=10", false},
		{"raft add-voter --id n4 --all-groups --catch-up-timeout 20s", false},
		{"usage query|bill", false},
		{"snapshot save -o FILE", false},
		{"completion bash", false},
		{"COMMAND --help", false},
		{"server --rate-period 100ms", true}, // a setting that is no flag
		{"limits frobnicate", true},          // no such subcommand
		{"status --tenant T --no-such-flag", true},
		{"usage query|charge", true},
		{`limits get\|set\|frob`, true},
		{`raft add-voter --id ID (--group G \| --all-groupz)`, true},
		{`raft add-voter --id ID (--group G \| --all-groups)`, false},
		{"snapshot save -Z FILE", true},
		{"track --tenant a | grep --count x", false}, // grep's flag, after the pipe
		{"server --tls-* --raft-tls-*", false},
		{"server --frob-*", true},
	}
	for _, c := range cases {
		got := checkInvocation(root, c.args)
		if (len(got) > 0) != c.bad {
			t.Errorf("tollgate %s: problems %v, want bad=%v", c.args, got, c.bad)
		}
	}
	anchors := headingAnchors([]string{"# Tollgate", "## Tenant-wide limits across groups (movable shares)", "## `tollgate limits`", "## Limits", "## Limits"})
	var ids []string
	for id := range anchors {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	want := []string{"limits", "limits-1", "tenant-wide-limits-across-groups-movable-shares", "tollgate", "tollgate-limits"}
	if strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Errorf("anchors %v, want %v", ids, want)
	}
}

// namedTest is a test the docs cite as an invariant's check, bare
// (TestShareModel) or with its package directory (fsm/shares.TestSplitSumsToLimit).
var namedTest = regexp.MustCompile(`(?:\b([a-z][a-z0-9]*(?:/[a-z][a-z0-9]*)*)\.)?\b((?:Test|Fuzz|Benchmark)[A-Z][A-Za-z0-9_]*)`)

// TestDocsNamedTestsExist: every test the docs name as the check of an
// invariant exists, in the package named; a renamed or deleted test fails
// here until the docs follow, so an invariant is never backed by a ghost.
func TestDocsNamedTestsExist(t *testing.T) {
	defined := map[string][]string{} // test name → package directories (slash, relative)
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]*)\(`)
	err := filepath.WalkDir(repoRoot, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "data") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(repoRoot, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = append(defined[m[1]], filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, file := range docFiles(t) {
		_, raw := readDoc(t, file)
		for i, l := range raw {
			for _, m := range namedTest.FindAllStringSubmatch(l, -1) {
				pkg, name := m[1], m[2]
				named++
				dirs, ok := defined[name]
				if !ok && (strings.Contains(l, "-run") || strings.Contains(l, name+"*")) {
					// A -run pattern or "TestSettles*" names a family: some test
					// must start so.
					for def, d := range defined {
						if strings.HasPrefix(def, name) {
							ok, dirs = true, append(dirs, d...)
						}
					}
				}
				if !ok {
					t.Errorf("%s:%d: names %s, which no _test.go defines", file, i+1, name)
					continue
				}
				if pkg == "" || !isPackageDir(pkg) {
					continue // bare, or a qualifier that is no package directory
				}
				if !slices.Contains(dirs, pkg) {
					t.Errorf("%s:%d: names %s.%s, but it is defined in %v", file, i+1, pkg, name, dirs)
				}
			}
		}
	}
	if named < 20 {
		t.Fatalf("only %d tests named in the docs: is the scanner broken?", named)
	}
}

// isPackageDir says whether dir (slash-separated, from the repository root)
// is a directory of the repository, i.e. a package qualifier.
func isPackageDir(dir string) bool {
	fi, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(dir)))
	return err == nil && fi.IsDir()
}
