package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The CSV trace families replay by their header, from a .csv name and
// from standard input with --trace-format csv: each replays every
// request, with the no-prefix-hashes note naming its family, and a
// BurstGPT trace's failed requests (Response tokens 0) are replayed and
// counted in a note. The traces are in each family's documented layout;
// no real sample of the Azure 2024 or BurstGPT files is bundled (see
// testdata/traces/README.md).
func TestReplayCSVFamilies(t *testing.T) {
	const (
		azure2024 = "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
			"2024-05-10 00:00:00.009930+00:00,2162,5\n" +
			"2024-05-10 00:00:00.017335+00:00,2399,6\n" +
			"2024-05-10 00:00:00.022314+00:00,76,15\n" +
			"2024-05-10 00:00:00.037845+00:00,2376,1\n" +
			"2024-05-10 00:00:00.083890+00:00,7670,8\n"
		burst = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" +
			"5,ChatGPT,472,18,490,Conversation log\n" +
			"45,ChatGPT,1087,230,1317,Conversation log\n" +
			"45,GPT-4,300,0,300,API log\n" +
			"118,GPT-4,417,276,693,Conversation log\n"
		burst3 = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n" +
			"10.5,a1,2.5,ChatGPT,100,20,120,Conversation log\n" +
			"11,,0.4,GPT-4,7,0,7,API log\n" +
			"12,a1,1.5,ChatGPT,140,30,170,Conversation log\n"
	)
	for _, tt := range []struct {
		name, content, family string
		requests, failed      int
	}{
		{"azure_2024.csv", azure2024, "Azure 2024", 5, 0},
		{"burstgpt_1.csv", burst, "BurstGPT", 4, 1},
		{"burstgpt_3.csv", burst3, "BurstGPT", 3, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.name, tt.content)
			noHashes := "router: note: trace " + tt.name + " has no prefix hashes (" + tt.family + " traces have token counts only)"
			code, out, errOut := routerRun(t, "replay", "--trace", path, "--workers", "2", "--report", "-")
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			if !strings.Contains(errOut, noHashes) {
				t.Errorf("stderr %q lacks %q", errOut, noHashes)
			}
			if !regexp.MustCompile(`"requests": ` + strconv.Itoa(tt.requests) + `,\s+"completed": ` + strconv.Itoa(tt.requests) + `,`).MatchString(out) {
				t.Errorf("report does not say %d requests, all completed:\n%s", tt.requests, out)
			}
			failedNote := "router: note: trace " + tt.name + ": " + strconv.Itoa(tt.failed) + " of " + strconv.Itoa(tt.requests) +
				" requests failed when the BurstGPT trace was recorded (Response tokens 0); they are replayed as requests that generate no token"
			if got := strings.Contains(errOut, failedNote); got != (tt.failed > 0) {
				t.Errorf("stderr %q: has the failed-requests note %q: %v, want %v", errOut, failedNote, got, tt.failed > 0)
			}
			code, _, errOut = routerRunStdin(t, strings.NewReader(tt.content), "replay", "--trace", "-", "--trace-format", "csv", "--workers", "2")
			if code != 0 || !strings.Contains(errOut, "router: note: trace stdin has no prefix hashes ("+tt.family+" traces") {
				t.Errorf("from stdin: exit %d, stderr %q", code, errOut)
			}
		})
	}
}

// A Mooncake trace whose requests carry no hash ids (only empty prompts
// may: one id per 512 prompt tokens) gets the note too, with its own
// reason.
func TestReplayMooncakeWithoutHashesNote(t *testing.T) {
	path := writeFile(t, "nohash.jsonl", `{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}`+"\n"+
		`{"timestamp": 10, "input_length": 0, "output_length": 3, "hash_ids": []}`+"\n")
	const want = "router: note: trace nohash.jsonl has no prefix hashes (its requests carry no hash_ids)"
	if code, _, errOut := routerRun(t, "replay", "--trace", path, "--workers", "2"); code != 0 || !strings.Contains(errOut, want) {
		t.Errorf("exit %d, stderr %q; want 0 and %q", code, errOut, want)
	}
}
