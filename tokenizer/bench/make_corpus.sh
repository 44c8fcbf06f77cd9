#!/usr/bin/env bash
# Writes the benchmark corpus (English prose, code, a little of many scripts) to $1: the license
# texts and C/Python sources every Debian machine has, so the numbers are reproducible anywhere.
set -euo pipefail
out=$1
{
  cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 /usr/share/common-licenses/LGPL-2.1
  cat /usr/lib/python3.11/{argparse,json/decoder,textwrap,difflib,email/message,subprocess,typing,inspect,tarfile,pydoc,doctest,turtle,pickletools,statistics,fractions,decimal,_pydecimal}.py
  cat /usr/include/stdio.h /usr/include/string.h
  for i in $(seq 20); do
    printf 'Numbers %d: 3.14159 2718281828 1,000,000 v1.2.%d\n\n' "$i" "$i"
    printf '日本語のテキストです。中文字符测试。한국어 텍스트. Привет, мир! 😀👍🏽\n\n'
  done
} > "$out"
