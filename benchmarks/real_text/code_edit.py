"""Code-edit prompts: a snippet of 10-25 lines to rename, refactor, fix or annotate and return
whole, so that most of the answer is copied from the prompt. Names are ``code_edit-NN``."""

from __future__ import annotations

from benchmarks.real_text.prose import code

_INVOICE = code('''
    def invoice_total(lines, tax_rate, discount=None):
        subtotal = 0
        for line in lines:
            qty = line["quantity"]
            price = line["unit_price"]
            subtotal += qty * price
        if discount is not None:
            if discount["kind"] == "percent":
                subtotal = subtotal * (1 - discount["value"] / 100)
            elif discount["kind"] == "fixed":
                subtotal = max(0, subtotal - discount["value"])
        tax = subtotal * tax_rate
        return round(subtotal + tax, 2)
''')

_STACK = code('''
    class Stack:
        def __init__(self):
            self.items = []

        def push(self, item):
            self.items.append(item)

        def pop(self):
            if len(self.items) == 0:
                raise IndexError("pop from an empty stack")
            return self.items.pop()

        def peek(self):
            return self.items[len(self.items)]

        def is_empty(self):
            return len(self.items) == 0
''')

_PARSE_DURATION = code('''
    def parse_duration(text):
        units = {"h": 3600, "m": 60, "s": 1}
        total = 0
        number = ""
        for ch in text.strip():
            if ch.isdigit():
                number += ch
            elif ch in units:
                if not number:
                    raise ValueError("unit without a number in " + text)
                total += int(number) * units[ch]
                number = ""
            else:
                raise ValueError("unexpected character " + ch)
        if number:
            raise ValueError("number without a unit in " + text)
        return total
''')

_JS_CART = code('''
    function cartSummary(items) {
      var count = 0;
      var total = 0;
      for (var i = 0; i < items.length; i++) {
        var item = items[i];
        if (item.removed) {
          continue;
        }
        count = count + item.qty;
        total = total + item.qty * item.price;
      }
      var shipping = total > 50 ? 0 : 4.99;
      return {
        count: count,
        total: total,
        shipping: shipping,
        grandTotal: total + shipping
      };
    }
''')

_GRADES = code('''
    def letter_grades(scores):
        result = {}
        for name in scores:
            s = scores[name]
            if s >= 90:
                result[name] = "A"
            elif s >= 80:
                result[name] = "B"
            elif s >= 70:
                result[name] = "C"
            elif s >= 60:
                result[name] = "D"
            else:
                result[name] = "F"
        return result
''')

_BINARY_SEARCH = code('''
    def find_index(sorted_values, target):
        lo = 0
        hi = len(sorted_values)
        while lo < hi:
            mid = (lo + hi) // 2
            if sorted_values[mid] == target:
                return mid
            if sorted_values[mid] < target:
                lo = mid
            else:
                hi = mid
        return -1
''')

_GO_RETRY = code('''
    func fetchWithRetry(client *http.Client, url string, attempts int) (*http.Response, error) {
        var lastErr error
        for i := 0; i < attempts; i++ {
            resp, err := client.Get(url)
            if err == nil && resp.StatusCode < 500 {
                return resp, nil
            }
            if err != nil {
                lastErr = err
            } else {
                lastErr = fmt.Errorf("server error: %d", resp.StatusCode)
                resp.Body.Close()
            }
            time.Sleep(time.Duration(i+1) * 200 * time.Millisecond)
        }
        return nil, lastErr
    }
''')

_TEMPERATURES = code('''
    def summarize_readings(readings):
        valid = []
        for r in readings:
            if r is not None and -60 <= r <= 60:
                valid.append(r)
        if len(valid) == 0:
            return None
        lowest = min(valid)
        highest = max(valid)
        mean = sum(valid) / len(valid)
        spread = highest - lowest
        return {"low": lowest, "high": highest, "mean": mean, "spread": spread,
                "dropped": len(readings) - len(valid)}
''')

_SQL_REPORT = code('''
    SELECT
        c.name,
        c.country,
        COUNT(o.id),
        SUM(o.total)
    FROM customers c, orders o
    WHERE c.id = o.customer_id
      AND o.created_at >= '2024-01-01'
      AND o.status <> 'cancelled'
    GROUP BY c.name, c.country
    HAVING SUM(o.total) > 1000
    ORDER BY SUM(o.total) DESC
    LIMIT 20;
''')

_WORD_WRAP = code('''
    def wrap(text, width):
        lines = []
        current = ""
        for word in text.split():
            if current == "":
                current = word
            elif len(current) + 1 + len(word) <= width:
                current = current + " " + word
            else:
                lines.append(current)
                current = word
        if current != "":
            lines.append(current)
        return "\\n".join(lines)
''')

_CONFIG_LOADER = code('''
    import json
    import os

    def load_config(path):
        f = open(path)
        data = json.load(f)
        port = data.get("port", 8080)
        host = data.get("host", "127.0.0.1")
        debug = data.get("debug", False)
        if "PORT" in os.environ:
            port = int(os.environ["PORT"])
        if "DEBUG" in os.environ:
            debug = os.environ["DEBUG"] == "1"
        return {"port": port, "host": host, "debug": debug}
''')

_INVENTORY = code('''
    class Inventory:
        def __init__(self):
            self.stock = {}

        def add(self, sku, n):
            if sku in self.stock:
                self.stock[sku] = self.stock[sku] + n
            else:
                self.stock[sku] = n

        def remove(self, sku, n):
            have = self.stock.get(sku, 0)
            if have < n:
                raise ValueError(f"only {have} of {sku} in stock")
            self.stock[sku] = have - n

        def low(self, threshold):
            return [sku for sku, n in self.stock.items() if n < threshold]
''')

_JS_VALIDATE = code('''
    function validateSignup(form) {
      const errors = [];
      if (!form.email || form.email.indexOf("@") === -1) {
        errors.push("email is invalid");
      }
      if (!form.password || form.password.length < 8) {
        errors.push("password is too short");
      }
      if (form.password !== form.confirm) {
        errors.push("passwords do not match");
      }
      if (form.age !== undefined && form.age < 13) {
        errors.push("you must be at least 13");
      }
      return errors;
    }
''')

_MOVING_AVERAGE = code('''
    def moving_average(xs, n):
        out = []
        for i in range(len(xs)):
            if i + 1 < n:
                continue
            window = xs[i - n + 1:i + 1]
            out.append(sum(window) / n)
        return out


    def smooth_series(series, n=3):
        return {key: moving_average(values, n) for key, values in series.items()}
''')

_DEDUP = code('''
    def dedupe_contacts(contacts):
        seen = []
        unique = []
        for c in contacts:
            key = c["email"].strip().lower()
            if key in seen:
                continue
            seen.append(key)
            unique.append(c)
        return unique
''')

_ROMAN = code('''
    def to_roman(n):
        # largest value first, the subtractive pairs (CM, XC, IV, ...) among them
        pairs = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                 (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
        out = ""
        for value, letters in pairs:
            while n >= value:
                out += letters
                n -= value
        return out
''')

CODE_EDIT = {
    "code_edit-01": "Rename the variable `subtotal` to `net_amount` everywhere in this function "
                    f"and return the whole function:\n\n```python\n{_INVOICE}```",
    "code_edit-02": "The `peek` method of this class has a bug. Fix it and return the whole "
                    f"class:\n\n```python\n{_STACK}```",
    "code_edit-03": "Add type hints and a docstring to this function. Return the complete "
                    f"function and nothing else.\n\n```python\n{_PARSE_DURATION}```",
    "code_edit-04": "Rewrite this JavaScript with `const`/`let` instead of `var` and a "
                    "`for...of` loop, keeping its behaviour. Return the whole function."
                    f"\n\n```javascript\n{_JS_CART}```",
    "code_edit-05": "Refactor this function so that the grade boundaries come from a list of "
                    "(threshold, letter) pairs instead of the if/elif chain. Return the whole "
                    f"function.\n\n```python\n{_GRADES}```",
    "code_edit-06": "This binary search can loop forever. Find the bug, fix it, and return the "
                    f"corrected function in full.\n\n```python\n{_BINARY_SEARCH}```",
    "code_edit-07": "Add a comment above each `if` in this Go function saying what case it "
                    f"handles. Return the whole function.\n\n```go\n{_GO_RETRY}```",
    "code_edit-08": "Rename `readings` to `samples` and `valid` to `in_range` in this function, "
                    f"and return it whole:\n\n```python\n{_TEMPERATURES}```",
    "code_edit-09": "Rewrite this query with an explicit JOIN ... ON instead of the comma join, "
                    "and give the aggregate columns the aliases order_count and revenue. Return "
                    f"the full query.\n\n```sql\n{_SQL_REPORT}```",
    "code_edit-10": "Add a docstring with two doctest examples to this function, then give it "
                    f"back in full:\n\n```python\n{_WORD_WRAP}```",
    "code_edit-11": "This function never closes the file it opens. Fix that with a `with` "
                    "statement and return the whole module, otherwise unchanged."
                    f"\n\n```python\n{_CONFIG_LOADER}```",
    "code_edit-12": "Make `add` use `dict.get` instead of the if/else, and add a method "
                    "`count(sku)` that returns the stock of one SKU (0 if unknown). Return the "
                    f"whole class.\n\n```python\n{_INVENTORY}```",
    "code_edit-13": "Translate the error messages in this function into French, changing "
                    f"nothing else, and return it whole.\n\n```javascript\n{_JS_VALIDATE}```",
    "code_edit-14": "Make `moving_average` faster by keeping a running sum instead of summing "
                    "each window, keep `smooth_series` as it is, and return both functions."
                    f"\n\n```python\n{_MOVING_AVERAGE}```",
    "code_edit-15": "`seen` is a list, so this is slow for many contacts. Change it to a set "
                    "and return the whole function, with everything else unchanged."
                    f"\n\n```python\n{_DEDUP}```",
    "code_edit-16": "Add input validation to this function: raise ValueError for n < 1 or "
                    f"n > 3999. Return the complete function.\n\n```python\n{_ROMAN}```",
}
