# SPDX-License-Identifier: Apache-2.0
# The functions of C source files and their lengths, by counting braces:
# prints "FILE:FUNCTION LINES" for each function defined at file scope, from
# the line that names it to its closing brace. Comments, strings, character
# constants and preprocessor lines are blanked first, so that a brace inside
# them is not counted. A struct, union, enum or initializer at file scope is
# not a function (its opening brace follows no parameter list).
#   awk -f tests/structure/c_functions.awk FILE...

FNR == 1 {
    depth = 0; in_comment = 0; in_define = 0; head = ""; head_line = 0
}

{
    line = $0
    # A preprocessor line, and the lines it continues with a backslash.
    if (in_define || line ~ /^[[:space:]]*#/) {
        in_define = (line ~ /\\$/)
        next
    }
    # Blank the comments, strings and character constants, left to right.
    out = ""
    while (line != "") {
        if (in_comment) {
            i = index(line, "*/")
            if (i == 0) { line = ""; break }
            line = substr(line, i + 2); in_comment = 0
            continue
        }
        if (match(line, /\/\*|\/\/|"|'/) == 0) { out = out line; break }
        out = out substr(line, 1, RSTART - 1)
        tok = substr(line, RSTART, RLENGTH)
        line = substr(line, RSTART + RLENGTH)
        if (tok == "//") break
        if (tok == "/*") { in_comment = 1; continue }
        # A string or a character constant: skip to its unescaped end.
        while (line != "") {
            c = substr(line, 1, 1)
            if (c == "\\") { line = substr(line, 3); continue }
            line = substr(line, 2)
            if (c == tok) break
        }
        out = out " "
    }
    n = length(out)
    for (k = 1; k <= n; k++) {
        c = substr(out, k, 1)
        if (depth == 0) {
            if (c == "{") {
                fn = ""
                if (head ~ /\)[[:space:]]*$/ && head !~ /=/) {
                    h = head
                    sub(/\(.*$/, "", h)
                    if (match(h, /[A-Za-z_][A-Za-z_0-9]*[[:space:]]*$/)) {
                        fn = substr(h, RSTART, RLENGTH)
                        gsub(/[[:space:]]/, "", fn)
                    }
                }
                start = head_line ? head_line : FNR
                depth = 1
                head = ""; head_line = 0
                continue
            }
            if (c == ";" || c == "}") { head = ""; head_line = 0; continue }
            if (c !~ /[[:space:]]/ && head_line == 0) head_line = FNR
            # The line that names a function is the one with its parameter list.
            if (c == "(" && head !~ /\(/) head_line = FNR
            head = head c
            continue
        }
        if (c == "{") depth++
        else if (c == "}") {
            depth--
            if (depth == 0 && fn != "") {
                print FILENAME ":" fn, FNR - start + 1
                fn = ""
            }
        }
    }
    if (depth == 0) head = head " "
}
