import io

from pgrecv.output.status_line import CLEAR, StatusLine


def test_status_line_redraws_in_place_and_clears() -> None:
    out = io.StringIO()
    line = StatusLine(out, interval=1.0)
    text = line.text(received=0x200, flushed=0x100, rows=0, transactions=0, now=100.0)
    assert "received 0/200" in text and "durable 0/100" in text and "lag 256 B" in text
    line.show(text, now=100.0)
    assert not line.due(100.5) and line.due(101.0)
    text = line.text(received=0x300, flushed=0x300, rows=500, transactions=5, now=102.0)
    assert "lag 0 B" in text and "500 rows" in text and "5 txns" in text
    assert line.rate > 0
    line.clear()
    line.clear()  # only once
    assert out.getvalue().count(CLEAR) == 2
    assert "\n" not in out.getvalue()
