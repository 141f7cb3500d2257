package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestEveryCommandHasOneLineShort: `tollgate --help` and every group's help
// list their commands with one line each, taken from Short; a command without
// one would show an empty line, one with a line break a broken table.
func TestEveryCommandHasOneLineShort(t *testing.T) {
	root := newRootCmd()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		n++
		s := strings.TrimSpace(c.Short)
		switch {
		case s == "":
			t.Errorf("%q has no Short (its line in --help)", c.CommandPath())
		case strings.Contains(c.Short, "\n"):
			t.Errorf("%q: Short spans lines: %q", c.CommandPath(), c.Short)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if n < 20 {
		t.Fatalf("only %d commands found", n)
	}

	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	for _, c := range root.Commands() {
		if c.Hidden {
			continue
		}
		line := ""
		for _, l := range strings.Split(help, "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] == c.Name() {
				line = l
			}
		}
		if !strings.Contains(line, c.Short) {
			t.Errorf("tollgate --help: no line \"%s  %s\"", c.Name(), c.Short)
		}
	}
}

// TestCompletionScripts: the completion command README.md and docs/cli.md document writes a
// script for each shell.
func TestCompletionScripts(t *testing.T) {
	for shell, marker := range map[string]string{"bash": "__start_tollgate", "zsh": "#compdef tollgate", "fish": "complete -c tollgate", "powershell": "Register-ArgumentCompleter"} {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs([]string{"completion", shell})
		if err := root.Execute(); err != nil {
			t.Fatalf("%s: %v", shell, err)
		}
		if !strings.Contains(out.String(), marker) {
			t.Errorf("tollgate completion %s: no %q in the script", shell, marker)
		}
	}
}
