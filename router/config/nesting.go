package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// MaxNesting is the deepest a policy file or a workers file may nest, in
// levels: 256. Each open bracket, brace, parenthesis, string or heredoc
// template, template sequence (${ } and %{ }) and %{ if } or %{ for }
// directive is a level, and so is each operator of one expression (+ - * /
// % == != < <= > >= && || ! ? . and an index [ ]), since HCL's parser
// and evaluator recurse on chains of those too: `- - - 1` is three
// levels, `a + b + c` two. A comma ends the operators' count, and so does a
// newline where it ends an item (in a body or an object, outside any
// bracket). CheckNesting refuses a deeper file before it is parsed: HCL
// parses recursively, and a 200 KB file nested 100,000 deep would exhaust
// the goroutine stack (a fatal error no recover catches), and one nested
// 20,000 deep would take hundreds of megabytes to load.
//
// The router's example policies nest 3 deep (5 in HCL's JSON syntax). A
// file at the limit loads with at most 4 MiB of goroutine stack and 2.5 MB
// allocated (BenchmarkLoadAtLimit; docs/policy-file.md gives the figures).
const MaxNesting = 256

// CheckNesting checks that src, a policy or workers file named filename,
// nests at most MaxNesting levels deep (see MaxNesting for what counts), in
// one pass that does not recurse: HCL's native syntax is read with HCL's own
// lexer, hclsyntax.LexConfig (the one its parser uses, so strings,
// comments and heredocs are told apart exactly as the parser tells them
// apart), and a filename ending in ".json" as JSON, whose strings may hold
// templates (read with hclsyntax.LexTemplate). A file of n bytes costs
// O(n) time and memory: at most the lexing that parsing it would cost.
//
// It returns nil, or one error diagnostic, "Nesting too deep", whose
// Subject is the first token past the limit (a bracket, or an operator),
// at its file:line:col. In a JSON file the column counts characters (HCL
// counts grapheme clusters; they differ only after combining characters on
// the same line), and inside a JSON string's template it is HCL's own: the
// string's start plus the offset in the string's value, which escapes
// before it shift.
func CheckNesting(filename string, src []byte) hcl.Diagnostics {
	if n := scanNesting(filename, src); n.err != nil {
		return hcl.Diagnostics{n.err}
	}
	return nil
}

// scanNesting is CheckNesting's scan, for the tests to read its depth.
func scanNesting(filename string, src []byte) *nester {
	n := &nester{}
	n.push(true, hclsyntax.TokenNil, false)
	if strings.HasSuffix(filename, ".json") {
		n.json(filename, src)
	} else {
		toks, _ := hclsyntax.LexConfig(src, filename, hcl.InitialPos)
		n.tokens(toks)
	}
	return n
}

// nestFrame is one open level of the scan: a bracket, a template, a
// directive, or (at the bottom) the file's body.
type nestFrame struct {
	close hclsyntax.TokenType // the token that closes it; TokenNil for the body and JSON's
	level int                 // what it adds to the depth itself: 1, or 0 for the body
	// lines: a newline ends an item here (a body, an object constructor,
	// not an object for expression), so it ends the operators' count.
	lines bool
	// first: no token has been seen inside yet (an object constructor
	// whose first token is "for" is a for expression, newlines included).
	first bool
	// directive: a %{ if } or %{ for } directive's body, closed by the
	// sequence of its %{ endif } or %{ endfor }.
	directive bool
	// keyword: for a %{ sequence, what its first word makes of it: +1 it
	// opens a directive, -1 it ends one, 0 neither.
	keyword int
	ops     int // operators in the current item
	child   int // the height of the tallest closed level in the current item
	best    int // the height of the tallest earlier item (ops + child)
}

// nester is CheckNesting's scan. Its depth is the sum, over the open
// frames, of each frame's level and operators, plus the height of the
// tallest closed level in the innermost frame's current item. It bounds,
// within a constant factor, how deep the parser recurses and how deep the
// syntax tree it builds is (a closed level's height counts in its parent,
// so `((x)+1)+1` is as deep as `((x+1)+1)`; TestCheckNestingBoundsTheTree
// checks the tree is at most 2 nodes per level deep). The depth only grows
// at a push or an operator, so the first token past the limit is one of
// those.
type nester struct {
	frames  []nestFrame
	sum     int // Σ level + ops over frames
	deepest int // the greatest depth seen
	err     *hcl.Diagnostic
}

func (n *nester) top() *nestFrame { return &n.frames[len(n.frames)-1] }

// check records the first excess, at rng.
func (n *nester) check(rng hcl.Range) {
	d := n.sum + n.top().child
	n.deepest = max(n.deepest, d)
	if n.err == nil && d > MaxNesting {
		n.err = &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Nesting too deep",
			Detail: fmt.Sprintf("The file nests deeper than %d levels here, so it is not loaded. Each bracket, brace, "+
				"parenthesis, string template, template sequence and heredoc is a level, and so is each operator "+
				"in one expression (see \"General rules\" in docs/policy-file.md).", MaxNesting),
			Subject: rng.Ptr(),
		}
	}
}

// push opens a level that the token close closes (TokenNil: one closed
// otherwise), in which a newline ends an item when lines is set, and which
// is a template directive's body when directive is set.
func (n *nester) push(lines bool, close hclsyntax.TokenType, directive bool) {
	level := 1
	if len(n.frames) == 0 {
		level = 0
	}
	n.frames = append(n.frames, nestFrame{close: close, level: level, lines: lines, first: true, directive: directive})
	n.sum += level
}

// op counts an operator of the current item.
func (n *nester) op() {
	n.top().ops++
	n.sum++
}

// item ends the current item of the innermost level (a comma, a newline).
func (n *nester) item() {
	f := n.top()
	f.best = max(f.best, f.ops+f.child)
	n.sum -= f.ops
	f.ops, f.child = 0, 0
}

// pop closes the innermost level; its height becomes a child of the next.
// It never adds depth: the height is that of an item already checked.
func (n *nester) pop() {
	f := n.frames[len(n.frames)-1]
	n.frames = n.frames[:len(n.frames)-1]
	n.sum -= f.level + f.ops
	t := n.top()
	t.child = max(t.child, f.level+max(f.best, f.ops+f.child))
}

// tokens scans native-syntax tokens; it stops at the first excess.
func (n *nester) tokens(toks hclsyntax.Tokens) {
	prev := hclsyntax.TokenNil // the previous token other than a comment or newline
	for i := range toks {
		tok := &toks[i]
		f := n.top()
		if f.first && tok.Type != hclsyntax.TokenNewline && tok.Type != hclsyntax.TokenComment {
			f.first = false
			switch {
			case f.close == hclsyntax.TokenCBrace && tok.Type == hclsyntax.TokenIdent && string(tok.Bytes) == "for":
				f.lines = false // {for ...} ignores newlines (HCL's parseObjectCons)
			case f.close == hclsyntax.TokenTemplateSeqEnd && tok.Type == hclsyntax.TokenIdent:
				switch string(tok.Bytes) {
				case "if", "for":
					f.keyword = 1
				case "endif", "endfor":
					f.keyword = -1
				}
			}
		}
		switch tok.Type {
		case hclsyntax.TokenOParen:
			n.push(false, hclsyntax.TokenCParen, false)
		case hclsyntax.TokenOBrack:
			if operandEnd(prev) { // an index: x[i][j] nests
				n.op()
				n.check(tok.Range)
			}
			n.push(false, hclsyntax.TokenCBrack, false)
		case hclsyntax.TokenOBrace:
			n.push(true, hclsyntax.TokenCBrace, false)
		case hclsyntax.TokenOQuote:
			n.push(false, hclsyntax.TokenCQuote, false)
		case hclsyntax.TokenOHeredoc:
			n.push(false, hclsyntax.TokenCHeredoc, false)
		case hclsyntax.TokenTemplateInterp, hclsyntax.TokenTemplateControl:
			n.push(false, hclsyntax.TokenTemplateSeqEnd, false)
		case hclsyntax.TokenCParen, hclsyntax.TokenCBrack, hclsyntax.TokenCBrace,
			hclsyntax.TokenCQuote, hclsyntax.TokenCHeredoc, hclsyntax.TokenTemplateSeqEnd:
			// A closer that does not close the innermost level is a
			// syntax error the parser reports; keeping the level open
			// can only count more.
			if f.close != tok.Type {
				break
			}
			keyword := f.keyword
			n.pop()
			switch {
			case keyword > 0:
				n.push(false, hclsyntax.TokenNil, true)
			case keyword < 0 && n.top().directive:
				n.pop()
			}
		case hclsyntax.TokenComma:
			n.item()
		case hclsyntax.TokenNewline:
			if f.lines {
				n.item()
			}
		case hclsyntax.TokenComment:
			// A line comment ends with its newline, which the parser
			// reads as one.
			if f.lines && bytes.HasSuffix(tok.Bytes, []byte("\n")) {
				n.item()
			}
		case hclsyntax.TokenPlus, hclsyntax.TokenMinus, hclsyntax.TokenStar, hclsyntax.TokenSlash,
			hclsyntax.TokenPercent, hclsyntax.TokenEqualOp, hclsyntax.TokenNotEqual,
			hclsyntax.TokenLessThan, hclsyntax.TokenLessThanEq, hclsyntax.TokenGreaterThan,
			hclsyntax.TokenGreaterThanEq, hclsyntax.TokenAnd, hclsyntax.TokenOr, hclsyntax.TokenBang,
			hclsyntax.TokenQuestion, hclsyntax.TokenDot:
			n.op()
		}
		n.check(tok.Range)
		if n.err != nil {
			return
		}
		if tok.Type != hclsyntax.TokenComment && tok.Type != hclsyntax.TokenNewline {
			prev = tok.Type
		}
	}
}

// operandEnd reports whether a token of type t can end an operand, so
// that a [ after it is an index rather than a tuple.
func operandEnd(t hclsyntax.TokenType) bool {
	switch t {
	case hclsyntax.TokenIdent, hclsyntax.TokenNumberLit, hclsyntax.TokenStar,
		hclsyntax.TokenCBrack, hclsyntax.TokenCParen, hclsyntax.TokenCBrace,
		hclsyntax.TokenCQuote, hclsyntax.TokenCHeredoc:
		return true
	}
	return false
}

// json scans src as HCL's JSON syntax: [ and { are levels, strings are
// skipped as HCL's JSON scanner skips them (to an unescaped quote or a
// control character), and a string that holds a template sequence (${ or
// %{), which HCL parses as a template when it evaluates the string with
// variables, is scanned as one, one level deeper.
func (n *nester) json(filename string, src []byte) {
	p := hcl.InitialPos
	for p.Byte < len(src) && n.err == nil {
		switch src[p.Byte] {
		case '[', '{':
			n.push(false, hclsyntax.TokenNil, false)
			n.check(hcl.Range{Filename: filename, Start: p, End: hcl.Pos{Line: p.Line, Column: p.Column + 1, Byte: p.Byte + 1}})
		case ']', '}':
			if len(n.frames) > 1 {
				n.pop()
			}
		case '"':
			end := jsonStringEnd(src, p.Byte)
			n.jsonTemplate(filename, src[p.Byte:end], p)
			p.Column += utf8.RuneCount(src[p.Byte:end])
			p.Byte = end
			continue
		case '\n':
			p.Line++
			p.Column = 0
		case '\r':
			p.Column-- // HCL's JSON scanner gives it no column
		case '\t':
			p.Column++ // HCL's JSON scanner gives it two
		}
		p.Byte++
		p.Column++
	}
}

// jsonStringEnd returns the end of the JSON string starting at src[i]
// (a quote): after its closing quote, or at the control character or end
// of src that cuts it short, as HCL's JSON scanner ends it.
func jsonStringEnd(src []byte, i int) int {
	escaping := false
	for i++; i < len(src); i++ {
		switch b := src[i]; {
		case b == '\\':
			escaping = !escaping
		case b == '"':
			if !escaping {
				return i + 1
			}
			escaping = false
		case b < 0x20:
			return i
		default:
			escaping = false
		}
	}
	return i
}

// jsonTemplate scans the JSON string str (with its quotes), which starts
// at start, as a template, one level deeper, when its value holds a
// template sequence. The tokens' positions are those HCL gives them: the
// string's start plus the offset in its value, exact when no escape comes
// before.
func (n *nester) jsonTemplate(filename string, str []byte, start hcl.Pos) {
	if !bytes.Contains(str, []byte("{")) && !bytes.Contains(str, []byte(`\u`)) {
		return // no { and no escape that could make one
	}
	var s string
	if json.Unmarshal(str, &s) != nil || (!strings.Contains(s, "${") && !strings.Contains(s, "%{")) {
		return
	}
	from := hcl.Pos{Line: start.Line, Column: start.Column + 1, Byte: start.Byte + 1}
	toks, _ := hclsyntax.LexTemplate([]byte(s), filename, from)
	depth := len(n.frames)
	n.push(false, hclsyntax.TokenNil, false)
	n.check(hcl.Range{Filename: filename, Start: start, End: from})
	if n.err == nil {
		n.tokens(toks)
	}
	for n.err == nil && len(n.frames) > depth { // and the levels the template left open
		n.pop()
	}
}
