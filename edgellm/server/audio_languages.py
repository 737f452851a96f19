"""The names OpenAI's speech-to-text API gives languages ("english" for "en"): verbose_json's
`language`. Whisper's language codes (its tokens <|en|> ... <|yue|>) with the English name
openai/whisper's tokenizer gives each, lower case.

    name("de") -> "german";  name("xx") -> "xx" (a code the table does not know: itself)
"""

from __future__ import annotations

_TABLE = """
en english; zh chinese; de german; es spanish; ru russian; ko korean; fr french;
ja japanese; pt portuguese; tr turkish; pl polish; ca catalan; nl dutch; ar arabic;
sv swedish; it italian; id indonesian; hi hindi; fi finnish; vi vietnamese; he hebrew;
uk ukrainian; el greek; ms malay; cs czech; ro romanian; da danish; hu hungarian;
ta tamil; no norwegian; th thai; ur urdu; hr croatian; bg bulgarian; lt lithuanian;
la latin; mi maori; ml malayalam; cy welsh; sk slovak; te telugu; fa persian;
lv latvian; bn bengali; sr serbian; az azerbaijani; sl slovenian; kn kannada;
et estonian; mk macedonian; br breton; eu basque; is icelandic; hy armenian;
ne nepali; mn mongolian; bs bosnian; kk kazakh; sq albanian; sw swahili;
gl galician; mr marathi; pa punjabi; si sinhala; km khmer; sn shona; yo yoruba;
so somali; af afrikaans; oc occitan; ka georgian; be belarusian; tg tajik;
sd sindhi; gu gujarati; am amharic; yi yiddish; lo lao; uz uzbek; fo faroese;
ht haitian creole; ps pashto; tk turkmen; nn nynorsk; mt maltese; sa sanskrit;
lb luxembourgish; my myanmar; bo tibetan; tl tagalog; mg malagasy; as assamese;
tt tatar; haw hawaiian; ln lingala; ha hausa; ba bashkir; jw javanese;
su sundanese; yue cantonese
"""

NAMES: dict[str, str] = dict(entry.split(maxsplit=1) for entry in
                             (e.strip() for e in _TABLE.split(";")))


def name(code: str | None) -> str:
    """The language's name as OpenAI gives it; an unknown code as it is ("" for None)."""
    return NAMES.get(code, code) if code else ""
