package trace

import (
	"bytes"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// azure2024Code is the header and the first five requests of the Azure
// 2024 week-long code trace (AzureLLMInferenceTrace_code_1week.csv) as
// Azure/AzurePublicDataset's analysis/AzureLLMInferenceDataset2024.ipynb
// prints them (commit b469a113). The file itself is not in the
// repository (it is served from Azure blob storage), so this is the
// notebook's values in the raw form its comment gives
// ("2024-05-12 00:00:00.001163+00:00"), not a byte-for-byte copy.
const azure2024Code = "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
	"2024-05-10 00:00:00.009930+00:00,2162,5\n" +
	"2024-05-10 00:00:00.017335+00:00,2399,6\n" +
	"2024-05-10 00:00:00.022314+00:00,76,15\n" +
	"2024-05-10 00:00:00.037845+00:00,2376,1\n" +
	"2024-05-10 00:00:00.083890+00:00,7670,8\n"

// burstGPTHead is hand-written in the layout of BurstGPT_1.csv (its
// six-column header, whole-second timestamps, a failed request with
// Response tokens 0); its values are made up.
const burstGPTHead = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" +
	"5,ChatGPT,472,18,490,Conversation log\n" +
	"45,ChatGPT,1087,230,1317,Conversation log\n" +
	"45,GPT-4,300,0,300,API log\n" +
	"118.25,GPT-4,417,276,693,Conversation log\n"

func TestAzure2024(t *testing.T) {
	recs, err := Read(strings.NewReader(azure2024Code), "code_1week.csv")
	if err != nil {
		t.Fatal(err)
	}
	us := time.Microsecond
	want := []Record{
		{Index: 0, Line: 2, Arrival: 0, InputLength: 2162, OutputLength: 5, Source: SourceAzure2024},
		{Index: 1, Line: 3, Arrival: 7405 * us, InputLength: 2399, OutputLength: 6, Source: SourceAzure2024},
		{Index: 2, Line: 4, Arrival: 12384 * us, InputLength: 76, OutputLength: 15, Source: SourceAzure2024},
		{Index: 3, Line: 5, Arrival: 27915 * us, InputLength: 2376, OutputLength: 1, Source: SourceAzure2024},
		{Index: 4, Line: 6, Arrival: 73960 * us, InputLength: 7670, OutputLength: 8, Source: SourceAzure2024},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("got %+v\nwant %+v", recs, want)
	}
	// The files omit an all-zero fraction (the notebook's comment).
	recs, err = Read(strings.NewReader("TIMESTAMP,ContextTokens,GeneratedTokens\r\n"+
		"2024-05-12 00:00:00+00:00,1,2\r\n2024-05-12 00:00:00.5+00:00,3,4\r\n2024-05-12 00:00:01+00:00,5,6"), "conv.csv")
	if err != nil {
		t.Fatal(err)
	}
	if got := []time.Duration{recs[0].Arrival, recs[1].Arrival, recs[2].Arrival}; !reflect.DeepEqual(got, []time.Duration{0, 500 * time.Millisecond, time.Second}) {
		t.Errorf("arrivals %v, want [0s 500ms 1s]", got)
	}
}

func TestAzure2024Errors(t *testing.T) {
	const hdr = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	for _, tt := range []struct {
		name, in string
		line     int
		want     string
		is       error
	}{
		{"2023 form in a 2024 trace", hdr + "2024-05-10 00:00:00.009930+00:00,2162,5\n2024-05-10 00:00:00.0173350,2399,6\n", 3,
			`c.csv:3: TIMESTAMP "2024-05-10 00:00:00.0173350": want a time such as 2024-05-10 00:00:00.009930+00:00 (as on the first line of an Azure 2024 trace)`, nil},
		{"neither form", hdr + "2024-05-10T00:00:00Z,2162,5\n", 2,
			`c.csv:2: TIMESTAMP "2024-05-10T00:00:00Z": want a time such as 2023-11-16 18:17:03.9799600 (Azure 2023) or 2024-05-10 00:00:00.009930+00:00 (Azure 2024)`, nil},
		{"decreasing", hdr + "2024-05-10 00:00:00.5+00:00,1,1\n2024-05-10 00:00:00.4+00:00,1,1\n", 3,
			"c.csv:3: timestamp decreases: 2024-05-10 00:00:00.4+00:00 after 2024-05-10 00:00:00.5+00:00", ErrTimestampDecreased},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tt.in), "c.csv")
			checkParseError(t, err, tt.want, tt.line, tt.is)
		})
	}
}

func TestBurstGPT(t *testing.T) {
	recs, err := Read(strings.NewReader(burstGPTHead), "BurstGPT_1.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{
		{Index: 0, Line: 2, Arrival: 0, InputLength: 472, OutputLength: 18, Source: SourceBurstGPT},
		{Index: 1, Line: 3, Arrival: 40 * time.Second, InputLength: 1087, OutputLength: 230, Source: SourceBurstGPT},
		{Index: 2, Line: 4, Arrival: 40 * time.Second, InputLength: 300, OutputLength: 0, Source: SourceBurstGPT},
		{Index: 3, Line: 5, Arrival: 113250 * time.Millisecond, InputLength: 417, OutputLength: 276, Source: SourceBurstGPT},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("got %+v\nwant %+v", recs, want)
	}
	// BurstGPT_3's columns, found by name: the Session ID is kept.
	recs, err = Read(strings.NewReader("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n"+
		"10.5,a1,2.5,ChatGPT,100,20,120,Conversation log\r\n"+
		"11,,0.4,GPT-4,7,3,10,API log\r\n"), "BurstGPT_3.csv")
	if err != nil {
		t.Fatal(err)
	}
	want = []Record{
		{Index: 0, Line: 2, Arrival: 0, InputLength: 100, OutputLength: 20, SessionID: "a1", Source: SourceBurstGPT},
		{Index: 1, Line: 3, Arrival: 500 * time.Millisecond, InputLength: 7, OutputLength: 3, Source: SourceBurstGPT},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("got %+v\nwant %+v", recs, want)
	}
}

func TestBurstGPTErrors(t *testing.T) {
	hdr := strings.SplitAfter(burstGPTHead, "\n")[0]
	const row = "5,ChatGPT,472,18,490,Conversation log\n"
	for _, tt := range []struct {
		name, in string
		line     int
		want     string
		is       error
	}{
		{"decreasing", hdr + row + "4.5,ChatGPT,1,1,2,API log\n", 3,
			"b.csv:3: timestamp decreases: Timestamp 4.5 after 5 s", ErrTimestampDecreased},
		{"bad timestamp", hdr + row + "5s,ChatGPT,1,1,2,API log\n", 3,
			`b.csv:3: Timestamp "5s": want seconds such as 5 or 5.25`, nil},
		{"NaN timestamp", hdr + "NaN,ChatGPT,1,1,2,API log\n", 2,
			`b.csv:2: Timestamp "NaN": want seconds such as 5 or 5.25`, nil},
		{"negative timestamp", hdr + "-1,ChatGPT,1,1,2,API log\n", 2,
			"b.csv:2: Timestamp: negative value (-1)", ErrNegative},
		{"huge timestamp", hdr + row + "1e10,ChatGPT,1,1,2,API log\n", 3,
			"b.csv:3: Timestamp 1e10 s: in nanoseconds it overflows a time.Duration", ErrDurationOverflow},
		{"negative tokens", hdr + row + "6,ChatGPT,-1,1,0,API log\n", 3,
			"b.csv:3: Request tokens: negative value (-1)", ErrNegative},
		{"empty response", hdr + row + "6,ChatGPT,1,,1,API log\n", 3,
			"b.csv:3: Response tokens: empty, want an integer", nil},
		{"unclosed quote", hdr + "\"5,ChatGPT,472,18,490,Conversation log\n", 2,
			`b.csv:2: extraneous or missing " in quoted-field`, nil},
		{"unclosed quote after a record", hdr + row + "6,\"ChatGPT,1,1,2,API log\n", 3,
			`b.csv:3: extraneous or missing " in quoted-field`, nil},
		{"field count", hdr + row + row + "6,ChatGPT,1,1,2\n", 4,
			"b.csv:4: wrong number of fields: want 6, Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", nil},
		{"missing column", "Timestamp,Model,Request tokens,Response tokens,Log Type\n" + row, 1,
			`b.csv:1: header "Timestamp,Model,Request tokens,Response tokens,Log Type": want TIMESTAMP,ContextTokens,GeneratedTokens (Azure) or ` +
				"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type (BurstGPT, which may add Session ID and Elapsed time)", nil},
		{"unknown column", strings.TrimSuffix(hdr, "\n") + ",Region\n", 1,
			`b.csv:1: header "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Region": want TIMESTAMP,ContextTokens,GeneratedTokens (Azure) or ` +
				`Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type (BurstGPT, which may add Session ID and Elapsed time): unknown column "Region"`, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tt.in), "b.csv")
			checkParseError(t, err, tt.want, tt.line, tt.is)
		})
	}
	if _, err := Read(strings.NewReader(hdr), "b.csv"); !errors.Is(err, ErrNoRecords) || err.Error() != "b.csv: no records" {
		t.Errorf("header only: %v, want b.csv: no records", err)
	}
}

// The header picks the reader: the same .csv name reads each family, and
// the records say which it was.
func TestCSVHeaderDetection(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Source
	}{
		{"TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n", SourceAzure2023},
		{azure2024Code, SourceAzure2024},
		{burstGPTHead, SourceBurstGPT},
	} {
		for rec, err := range Records(strings.NewReader(tt.in), "t.csv", FormatOf("t.csv")) {
			if err != nil {
				t.Fatal(err)
			}
			if rec.Source != tt.want {
				t.Errorf("%q: record %d read as %q, want %q", tt.in[:20], rec.Index, rec.Source, tt.want)
			}
		}
	}
}

// TestByteOrderMark reads traces saved with a UTF-8 byte order mark (as a
// spreadsheet's "CSV UTF-8" or a Windows editor saves them) as the same
// traces without it: the mark is not part of the first header or line.
func TestByteOrderMark(t *testing.T) {
	const bom = "\xef\xbb\xbf"
	mooncake := `{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}` + "\n" +
		`{"timestamp": 5, "input_length": 20, "output_length": 3, "hash_ids": [1]}` + "\n"
	for _, tc := range []struct{ name, text string }{
		{"a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n2023-11-16 18:15:50.9951690,396,109\r\n"},
		{"code_1week.csv", azure2024Code},
		{"b.csv", burstGPTHead},
		{"m.jsonl", mooncake},
	} {
		want, err := Read(strings.NewReader(tc.text), tc.name)
		if err != nil {
			t.Fatalf("%s without a BOM: %v", tc.name, err)
		}
		got, err := Read(strings.NewReader(bom+tc.text), tc.name)
		if err != nil {
			t.Fatalf("%s with a BOM: %v", tc.name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s with a BOM: got %+v, want %+v", tc.name, got, want)
		}
	}
}

// FuzzReadCSV reads arbitrary bytes as a .csv trace (Azure or BurstGPT, by
// the header): it must not panic, and an error names the file and a line
// of it. The seeds include the malformed quotes that once made
// csv.Reader.FieldPos panic after a failed Read.
func FuzzReadCSV(f *testing.F) {
	f.Add([]byte(azure2024Code))
	f.Add([]byte(burstGPTHead))
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n\"2023-11-16 18:15:46.6805900,374,44\n"))
	f.Add([]byte(burstGPTHead + "\"5,ChatGPT,472,18,490,Conversation log\n"))
	f.Add([]byte("\"TIMESTAMP,ContextTokens,GeneratedTokens\n"))
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n\"2023-11-16 18:17:04.0319600\"x,1,1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := Read(bytes.NewReader(data), "f.csv")
		if err != nil {
			var pe *ParseError
			if errors.Is(err, ErrNoRecords) {
				return
			}
			if !errors.As(err, &pe) || pe.Line < 1 || pe.Line > bytes.Count(data, []byte("\n"))+1 ||
				!strings.HasPrefix(err.Error(), "f.csv:"+strconv.Itoa(pe.Line)+": ") {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		for i, r := range recs {
			if r.Index != i || r.InputLength < 0 || r.OutputLength < 0 || r.Arrival < 0 || r.Line < 2 {
				t.Fatalf("bad record %+v", r)
			}
		}
	})
}
